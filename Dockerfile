# cdcd in a container: docker build -t cdcd . && docker run -v $PWD/pipeline.toml:/etc/cdcd/pipeline.toml cdcd
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked && strip target/release/cdcd

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home /var/lib/cdcd --create-home cdcd
COPY --from=build /src/target/release/cdcd /usr/local/bin/cdcd
USER cdcd
WORKDIR /var/lib/cdcd
# SIGTERM commits what is buffered and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/cdcd"]
CMD ["--config", "/etc/cdcd/pipeline.toml"]
