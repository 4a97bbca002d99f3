# cdcd container image: a multi-stage build, a small non-root runtime.
#
#   docker build -t cdcd .
#   docker run --rm -v $PWD/pipeline.toml:/etc/cdcd/pipeline.toml:ro -v cdcd-state:/var/lib/cdcd \
#     -e CDCD_SOURCE__PASSWORD=... -e CDCD_METRICS__LISTEN=0.0.0.0:9187 -p 9187:9187 cdcd
#
# Inside a container `[metrics] listen` must be 0.0.0.0:<port> to be reachable (the example config
# says 127.0.0.1); CDCD_METRICS__LISTEN overrides it. Probes: GET /healthz (liveness) and
# GET /readyz (readiness). SIGTERM (docker stop) commits what is buffered and exits 0: give it
# time with `docker stop -t 120` / terminationGracePeriodSeconds.

FROM rust:1.94-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so code changes do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --release --locked \
    && rm -rf src
COPY src ./src
RUN touch src/main.rs src/lib.rs && cargo build --release --locked \
    && strip target/release/cdcd

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates tzdata \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 cdcd \
    && useradd --system --uid 10001 --gid cdcd --home-dir /var/lib/cdcd --shell /usr/sbin/nologin cdcd \
    && mkdir -p /etc/cdcd /var/lib/cdcd && chown cdcd:cdcd /var/lib/cdcd
COPY --from=build /src/target/release/cdcd /usr/local/bin/cdcd
COPY config/pipeline.example.toml /etc/cdcd/pipeline.example.toml
USER 10001:10001
WORKDIR /var/lib/cdcd
# The warehouse (when local) and spill files live here.
VOLUME ["/var/lib/cdcd"]
ENV TMPDIR=/var/lib/cdcd CDCD_LOG=info
EXPOSE 9187
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/cdcd"]
CMD ["--config", "/etc/cdcd/pipeline.toml"]
