# syntax=docker/dockerfile:1
# serval in a container: three stages.
#   web      builds the browser UI (Node.js 20; Debian 12's own is 18, below
#            Vite 8's floor) and writes the C++ source that embeds it
#   build    builds serval on Debian 12 with the project's own install script
#            (baseline x86-64: the kernels pick the CPU's ISA at run time)
#   runtime  Debian 12 slim, the binary and its four shared libraries, a
#            non-root user, a health check on /health
# Models are mounted read-only at /models:
#   docker build -t serval .
#   docker run -p 8080:8080 -v "$PWD/models:/models:ro" serval \
#       serve -m /models/model.gguf --host 0.0.0.0 --port 8080
# (docs/DEPLOY.md; CI lints this file, tests/deploy, as no Docker engine runs there.)

FROM node:20-bookworm-slim AS web
WORKDIR /src/web
COPY web/package.json web/package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error
COPY web/ ./
RUN bash scripts/build.sh /out

FROM debian:12 AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/
RUN ./scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
COPY --from=web /out/webui_assets.cpp /webui/webui_assets.cpp
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSERVAL_BUILD_TESTS=OFF -DSERVAL_BUILD_BENCH=OFF \
        -DSERVAL_WEBUI_ASSETS=/webui/webui_assets.cpp \
    && cmake --build build --target serval \
    && strip build/serval

FROM debian:12-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends libpcre2-32-0 libsqlite3-0 libtomlplusplus3 libssl3 libopenmpi3 \
        curl ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 serval \
    && useradd --system --uid 10001 --gid serval --home-dir /var/lib/serval --create-home --shell /usr/sbin/nologin serval
COPY --from=build /src/build/serval /usr/local/bin/serval
USER 10001:10001
WORKDIR /var/lib/serval
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8080/health"]
ENTRYPOINT ["/usr/local/bin/serval"]
CMD ["serve", "-m", "/models/model.gguf", "--host", "0.0.0.0", "--port", "8080"]
