# `mamba2 serve` (the example CLI's OpenAI-compatible server) on the shipped byte-level Mamba-2,
# on CPU, starting without the network.
#
#   docker build -t stablegraph-serve .
#   docker run --rm -p 8080:8080 stablegraph-serve            # flags after the image go to serve
#
# See docs/serving.md ("Deploying: Docker and replicas behind nginx").

# Stage 1: build the example and fetch the XLA CPU PJRT plugin.
FROM rust:1-bookworm AS build
# pip fetches the plugin wheel (the binary runs `python3 -m pip download` on first use).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-pip \
 && rm -rf /var/lib/apt/lists/*
# The same directory as in the runtime stage: the binary finds the shipped model under the crate
# root it was built in (models/mamba2-bytes there), so its default needs no --model.
WORKDIR /app
COPY . .
RUN cargo build --release --example mamba2 \
 && install -D target/release/examples/mamba2 /out/mamba2
# The first run fetches the plugin into the plugin cache (pinned wheel, SHA-256 checked) and
# unpacks its shared object; one generated token is enough. No compile cache: nothing to keep.
ENV STABLEGRAPH_PLUGIN_DIR=/opt/stablegraph/plugins
RUN STABLEGRAPH_CACHE=0 /out/mamba2 generate --max-new-tokens 1 \
 && so="$(find "$STABLEGRAPH_PLUGIN_DIR" -name '*.so' -print -quit)" \
 && test -n "$so" \
 && install -D -m 0644 "$so" /out/pjrt_cpu_plugin.so

# Stage 2: the binary, the plugin and the model on slim Debian (no Rust, no Python).
FROM debian:bookworm-slim
# curl for the health check; libstdc++ for the plugin.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends curl libstdc++6 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 stablegraph \
 && install -d -o stablegraph -g stablegraph /home/stablegraph/.cache
COPY --from=build /out/mamba2 /usr/local/bin/mamba2
COPY --from=build /out/pjrt_cpu_plugin.so /opt/stablegraph/pjrt_cpu_plugin.so
COPY --from=build /app/models/mamba2-bytes /app/models/mamba2-bytes
# The plugin by path; STABLEGRAPH_OFFLINE: never run pip (a missing plugin is an error). Compiled
# programs are cached in $HOME/.cache/stablegraph/executables: a volume on /home/stablegraph/.cache
# keeps them across containers.
ENV STABLEGRAPH_PJRT_PLUGIN=/opt/stablegraph/pjrt_cpu_plugin.so \
    STABLEGRAPH_OFFLINE=1 \
    HOME=/home/stablegraph
WORKDIR /app
USER stablegraph
EXPOSE 8080
# /health answers 200 once serve has compiled its programs and listens: for the shipped model on
# a busy 2-core machine, 97 s with an empty compile cache and 3 s with a warm one (a larger model,
# or more prompt buckets, takes longer). Healthy is reported at the first check that passes.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/health || exit 1
ENTRYPOINT ["mamba2", "serve", "--host", "0.0.0.0"]
