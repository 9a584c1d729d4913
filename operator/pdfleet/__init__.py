"""pdfleet: a Kubernetes operator for prefill/decode-disaggregated LLM inference fleets."""

__version__ = "0.1.0"

API_GROUP = "pdfleet.dev"
API_VERSION = "v1alpha1"
KIND = "PDDeployment"
PLURAL = "pddeployments"
POOLS: tuple[str, str] = ("prefill", "decode")  # the two pools of every PDDeployment, in placement order
# The one image (Dockerfile) of the operator and the routers it creates; the chart's default (tag = appVersion)
OPERATOR_IMAGE = f"ghcr.io/pdfleet/pdfleet:{__version__}"
