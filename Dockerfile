# The one pdfleet image: the operator (`pdfleet operator`) and the routers it creates (`pdfleet router`) run from it.
# Build (docs/install.md): docker build -t ghcr.io/pdfleet/pdfleet:0.1.0 .   (the chart's default image)

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN python -m venv /opt/pdfleet \
    && /opt/pdfleet/bin/pip install --no-cache-dir --upgrade pip \
    && /opt/pdfleet/bin/pip install --no-cache-dir .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="pdfleet" \
      org.opencontainers.image.description="Operator and router for prefill/decode-disaggregated LLM fleets" \
      org.opencontainers.image.source="https://github.com/pdfleet/pdfleet" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/pdfleet /opt/pdfleet
# The chart runs it as 65532 with a read-only root filesystem: nothing may write .pyc files at run time.
ENV PATH=/opt/pdfleet/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["pdfleet"]
CMD ["--help"]
