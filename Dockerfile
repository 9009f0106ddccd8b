# The Conclave server. Multi-stage: a Rust builder compiles the release
# binary (the dashboard in static/ is embedded by rust-embed at build time),
# a slim Debian runtime runs it as a non-root user.
#
#   docker build -t conclave .
#   docker run -p 8080:8080 -e CONCLAVE_API_KEYS=a-long-secret conclave
#
# `--target prebuilt` makes the same runtime image around a `conclave`
# binary already built for its base, the only file of its build context
# (scripts/lib.sh's ensure_server_image does that with the binary cargo
# has just built: compiling again inside docker takes 20 to 40 minutes on
# a 2-core machine). Docker's classic builder stops at the target, so the
# compiling stages below are not run then.
#
# Base images are build arguments, so the image builds from public images
# (the defaults) or from local ones where no registry can be reached
# (scripts/lib.sh's ensure_server_image builds with a builder made from the
# debootstrapped conclave/base-shell:bookworm and the host's toolchain).
ARG BUILDER_IMAGE=rust:1-bookworm
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS runtime
# libseccomp2 (the local sandbox's filters) is in Debian's base already:
# apt depends on it. git is what options.workspace.git clones with (the
# server fetches, not the sandbox); INSTALL_GIT=false leaves it out, and
# such sessions then end their first turn with "git is not installed on
# the server".
ARG INSTALL_GIT=true
RUN if [ "$INSTALL_GIT" = true ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends git ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi
RUN useradd --system --uid 65532 --user-group --home-dir /var/lib/conclave --create-home conclave
# Numeric, so Kubernetes' runAsNonRoot can check it.
USER 65532:65532
WORKDIR /var/lib/conclave
# Listening on every interface needs API keys: set CONCLAVE_API_KEYS
# (comma-separated) or api_keys in a config file, or the server refuses to
# start. CONCLAVE_ALLOWED_HOSTS lists the names clients reach it by (keep
# 127.0.0.1: the health check asks there).
ENV CONCLAVE_LISTEN=0.0.0.0:8080 \
    CONCLAVE_DATA_DIR=/var/lib/conclave
EXPOSE 8080
# `conclave health` asks /health on the local listener: no curl needed, and
# it works on any base image.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["conclave", "health"]
ENTRYPOINT ["conclave"]
CMD ["serve"]

FROM runtime AS prebuilt
COPY conclave /usr/local/bin/conclave

FROM ${BUILDER_IMAGE} AS builder
WORKDIR /build
# The binary is stripped: no debug info to compile or to write into layers.
ENV CARGO_PROFILE_RELEASE_DEBUG=false
# The dependencies first, in a layer of their own: a change under src/
# rebuilds the crate alone. Cargo needs every target the manifest declares,
# so the benches and the sources are stubs here.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src/bin/conclave-exec.rs src/bin/conclave-exec.rs
RUN mkdir -p benches \
    && for bench in $(sed -n '/^\[\[bench\]\]/{n;s/^name = "\(.*\)"$/\1/p}' Cargo.toml); do \
           echo 'fn main() {}' > "benches/$bench.rs"; \
       done \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && cargo build --release --locked --bin conclave \
    && rm -rf src/main.rs src/lib.rs target/release/.fingerprint/conclave-*
COPY src src
COPY static static
RUN cargo build --release --locked --bin conclave \
    && strip target/release/conclave

FROM runtime
COPY --from=builder /build/target/release/conclave /usr/local/bin/conclave
