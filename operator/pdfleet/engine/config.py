"""`pdfleet engine serve` arguments: vLLM's own `serve` flags plus emulator-only ones, parsed into EngineSettings.

Unknown vLLM flags are collected (and warned about by the CLI), so rendered manifests for real vLLM run unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from dataclasses import dataclass, field

from pdfleet.cli.argtypes import CommandParser, non_negative_int, positive_float, positive_int
from pdfleet.engine.faults import Faults
from pdfleet.perfmodel import presets
from pdfleet.perfmodel.vllm_args import add_vllm_serve_arguments

ROLE_BY_KV_ROLE = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "both"}
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
KV_LEASE_DURATION_S = 30.0  # vLLM 0.32 NixlConnector kv_connector_extra_config.kv_lease_duration default


@dataclass
class EngineSettings:
    """Everything one emulator process needs to know."""

    model: str
    served_model_names: list[str]
    host: str = "0.0.0.0"
    port: int = 8000
    role: str = "both"  # prefill | decode | both
    kv_connector: str | None = None
    kv_connector_extra_config: dict = field(default_factory=dict)
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    kv_cache_dtype: str = "auto"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    max_model_len: int | None = None  # None: the preset's
    block_size: int = 16
    kv_load_failure_policy: str = "fail"  # fail | recompute
    model_preset: str = presets.DEFAULT_MODEL
    gpu_preset: str = presets.DEFAULT_GPU
    intra_rack_link: str = presets.DEFAULT_INTRA_RACK
    cross_rack_link: str = presets.DEFAULT_CROSS_RACK
    speedup: float = 1.0
    zero_delay: bool = False
    rack: str = ""
    natural_output_tokens: int = 256
    kv_hold_ttl_s: float = KV_LEASE_DURATION_S
    advertise_host: str = "127.0.0.1"
    faults: Faults = field(default_factory=Faults)
    ignored_args: list[str] = field(default_factory=list)

    @property
    def served_model_name(self) -> str:
        """The name reported in responses and metrics (the first served name)."""
        return self.served_model_names[0]

    @property
    def nixl(self) -> bool:
        """Started with a NIXL kv connector (NixlConnector and its Pull/Push variants): exports vllm:nixl_*."""
        return "nixl" in (self.kv_connector or "").lower()


def _parser(exit_on_error: bool = True) -> argparse.ArgumentParser:
    p = CommandParser(
        prog="pdfleet engine serve",
        allow_abbrev=False,
        exit_on_error=exit_on_error,
        description="vLLM-compatible engine emulator (accepts `vllm serve` arguments)",
    )
    add_vllm_serve_arguments(p.add_argument_group("vLLM arguments"))
    emu = p.add_argument_group("emulator arguments")
    emu.add_argument(
        "--emulator-model",
        default=os.environ.get("PDFLEET_EMULATOR_MODEL"),
        help=f"model preset ({', '.join(presets.MODELS)}); default: guessed from the model id",
    )
    emu.add_argument(
        "--emulator-gpu",
        default=os.environ.get("PDFLEET_EMULATOR_GPU", presets.DEFAULT_GPU),
        help=f"GPU preset ({', '.join(presets.GPUS)})",
    )
    emu.add_argument(
        "--emulator-intra-rack-link",
        default=presets.DEFAULT_INTRA_RACK,
        help=f"interconnect preset within a rack ({', '.join(presets.INTERCONNECTS)})",
    )
    emu.add_argument(
        "--emulator-cross-rack-link",
        default=presets.DEFAULT_CROSS_RACK,
        help=f"interconnect preset between racks ({', '.join(presets.INTERCONNECTS)})",
    )
    speed = emu.add_mutually_exclusive_group()
    speed.add_argument(
        "--emulator-speedup", type=positive_float, default=1.0, help="divide every modelled time by FACTOR"
    )
    speed.add_argument("--emulator-zero-delay", action="store_true", help="answer at once (router benchmarks)")
    emu.add_argument(
        "--emulator-output-len",
        type=positive_int,
        default=256,
        help="tokens after which the emulated model emits EOS (unless ignore_eos)",
    )
    emu.add_argument(
        "--emulator-kv-ttl",
        type=positive_float,
        help="seconds a prefill keeps KV blocks for a pull (default: the kv-transfer-config's "
        f"kv_connector_extra_config.kv_lease_duration, else {KV_LEASE_DURATION_S:g} as vLLM 0.32)",
    )
    emu.add_argument(
        "--emulator-advertise-host",
        help="host put in remote_host (default: PDFLEET_ADVERTISE_HOST, POD_IP, --host, 127.0.0.1)",
    )
    emu.add_argument("--rack", default=os.environ.get("PDFLEET_RACK", ""), help="this engine's rack (env PDFLEET_RACK)")
    faults = p.add_argument_group("fault injection")
    faults.add_argument(
        "--fault-fail-kv-source",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="fail the next N KV pulls served (as prefill)",
    )
    faults.add_argument(
        "--fault-fail-kv-pull",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="fail the next N KV pulls made (as decode)",
    )
    faults.add_argument("--fault-hang", action="store_true", help="accept requests and never answer them")
    faults.add_argument(
        "--fault-crash-after-tokens",
        type=positive_int,
        metavar="K",
        help="exit abruptly once a request has produced K tokens",
    )
    faults.add_argument(
        "--fault-slowdown", type=positive_float, default=1.0, metavar="FACTOR", help="multiply every modelled time"
    )
    faults.add_argument("--fault-unhealthy", action="store_true", help="answer GET /health with 503")
    return p


def _advertise_host(flag: str | None, bind_host: str) -> str:
    for candidate in (flag, os.environ.get("PDFLEET_ADVERTISE_HOST"), os.environ.get("POD_IP")):
        if candidate:
            return candidate
    return "127.0.0.1" if bind_host in WILDCARD_HOSTS else bind_host


def parse_serve_args(argv: list[str]) -> EngineSettings:
    """Parse `serve` arguments (the words after `pdfleet engine serve`); SystemExit on bad values, like argparse."""
    parser = _parser()
    model = argv[0] if argv and not argv[0].startswith("-") else None
    args, unknown = parser.parse_known_args(argv[1:] if model else argv)
    model = model or args.model_flag
    if not model:
        parser.error("a model is required (positional or --model)")
    kv_config = json.loads(args.kv_transfer_config) if args.kv_transfer_config else {}
    if not isinstance(kv_config, dict):
        parser.error("--kv-transfer-config must be a JSON object")
    kv_role = kv_config.get("kv_role")
    if kv_role not in (None, *ROLE_BY_KV_ROLE):
        parser.error(f"unknown kv_role {kv_role!r}")
    extra_config = kv_config.get("kv_connector_extra_config") or {}
    if not isinstance(extra_config, dict):
        parser.error("kv_connector_extra_config must be a JSON object")
    kv_ttl = args.emulator_kv_ttl
    if kv_ttl is None:
        kv_ttl = extra_config.get("kv_lease_duration", KV_LEASE_DURATION_S)
        if isinstance(kv_ttl, bool) or not isinstance(kv_ttl, (int, float)) or kv_ttl <= 0:
            parser.error("kv_connector_extra_config.kv_lease_duration must be a positive number")
    try:
        model_preset = (
            presets.model_preset(args.emulator_model) if args.emulator_model else presets.guess_model_preset(model)
        )
        gpu_preset = presets.gpu_preset(args.emulator_gpu)
        for link in (args.emulator_intra_rack_link, args.emulator_cross_rack_link):
            presets.interconnect_preset(link)
    except KeyError as exc:
        parser.error(str(exc.args[0]))
    if args.emulator_speedup <= 0:
        parser.error("--emulator-speedup must be positive")
    faults = Faults()
    try:
        faults.update(
            {
                "fail_kv_source": args.fault_fail_kv_source,
                "fail_kv_pull": args.fault_fail_kv_pull,
                "hang": args.fault_hang,
                "crash_after_tokens": args.fault_crash_after_tokens,
                "slowdown": args.fault_slowdown,
                "unhealthy": args.fault_unhealthy,
            }
        )
    except ValueError as exc:
        parser.error(str(exc))
    settings = EngineSettings(
        model=model,
        served_model_names=args.served_model_name or [model],
        host=args.host,
        port=args.port,
        role=ROLE_BY_KV_ROLE.get(kv_role, "both"),
        kv_connector=kv_config.get("kv_connector"),
        kv_connector_extra_config=extra_config,
        kv_cache_dtype=args.kv_cache_dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        kv_load_failure_policy=args.kv_load_failure_policy or kv_config.get("kv_load_failure_policy", "fail"),
        model_preset=model_preset.name,
        gpu_preset=gpu_preset.name,
        intra_rack_link=args.emulator_intra_rack_link,
        cross_rack_link=args.emulator_cross_rack_link,
        speedup=args.emulator_speedup,
        zero_delay=args.emulator_zero_delay,
        rack=args.rack,
        natural_output_tokens=args.emulator_output_len,
        kv_hold_ttl_s=float(kv_ttl),
        advertise_host=_advertise_host(args.emulator_advertise_host, args.host),
        faults=faults,
        ignored_args=unknown,
    )
    if kv_config.get("engine_id"):
        settings.engine_id = str(kv_config["engine_id"])
    if settings.kv_load_failure_policy not in ("fail", "recompute"):
        parser.error("kv_load_failure_policy must be fail or recompute")
    return settings
