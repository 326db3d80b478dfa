# syntax=docker/dockerfile:1
# transfer-service image: a release build in the official Rust image, run as a non-root user
# on Debian slim. Not built by the test suite (no Docker on our build machines).

# The toolchain the project is built and tested with (the locked dependencies need >= 1.90).
FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target/ between builds (BuildKit); the binary is copied
# out of the cached target/ in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin transfer-service \
    && cp target/release/transfer-service /usr/local/bin/transfer-service

FROM debian:bookworm-slim
# curl only for the health check below (slim images have none); TLS to Elasticsearch is
# rustls with built-in roots, so no OpenSSL or CA bundle is needed at run time.
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin app \
    && install -d -o app -g app /var/lib/transfer-service
COPY --from=builder /usr/local/bin/transfer-service /usr/local/bin/transfer-service

# Listen on every interface inside the container; the embedded store (used only when
# ELASTICSEARCH_URL is unset) lives in a directory the non-root user owns.
ENV LISTEN_ADDR=0.0.0.0:8080 \
    DATA_DIR=/var/lib/transfer-service \
    LOG_FORMAT=json \
    RUST_LOG=info
USER app
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD curl -fsS -o /dev/null http://127.0.0.1:8080/readyz || exit 1
# SIGTERM (docker stop) shuts down gracefully: workers stop at a step boundary.
ENTRYPOINT ["/usr/local/bin/transfer-service"]
