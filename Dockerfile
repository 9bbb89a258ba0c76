# Cairn image: one image holds every binary; the Helm chart picks one per component
# (cairn-scheduler, cairn-worker, cairn-reaper, and cairnctl for migrations).
#
#   docker build -t cairn:dev .

# ---- build ---------------------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /src
# Queries are checked at run time (sqlx::query_as), so the build needs no database.
ENV CARGO_TERM_COLOR=never
COPY . .
# The registry cache only speeds up rebuilds; target/ stays in the layer so the
# binaries can be copied out below.
# The image's binaries are stripped of their symbol tables too (a local release build
# keeps them, for backtraces with function names): a panic still prints its message and
# source location.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    CARGO_PROFILE_RELEASE_STRIP=symbols cargo build --release --locked --bins

# ---- runtime -------------------------------------------------------------------------
FROM debian:bookworm-slim
# git: the worker clones and inspects workspaces. ca-certificates: TLS to Postgres,
# RabbitMQ, Redis and object stores. tini: PID 1 that forwards signals and reaps children.
# bubblewrap: the step sandbox (not set-user-id: it needs user namespaces in the pod);
# slirp4netns and nftables: the NAT and egress filter of a step with the network;
# nsenter, which enters a sandbox resource's held namespaces, is util-linux's, in the base.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap slirp4netns nftables btrfs-progs ca-certificates git tini \
 && rm -rf /var/lib/apt/lists/*
# A fixed non-root user; the chart runs every container as uid/gid 10001.
RUN groupadd --system --gid 10001 cairn \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin cairn \
 && mkdir -p /var/lib/cairn/workspaces \
 && chown -R 10001:10001 /var/lib/cairn
COPY --from=builder /src/target/release/cairn-scheduler \
                    /src/target/release/cairn-worker \
                    /src/target/release/cairn-reaper \
                    /src/target/release/cairnctl \
                    /usr/local/bin/
USER 10001:10001
ENV HOME=/tmp \
    CAIRN_WORKSPACES_DIR=/var/lib/cairn/workspaces
WORKDIR /var/lib/cairn
# The chart passes the binary as the container's args, so tini stays PID 1.
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["cairn-scheduler"]
