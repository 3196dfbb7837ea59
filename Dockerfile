# syntax=docker/dockerfile:1
#
# The tokenmill image: one image for the producer, the workers, the dashboard and the SGLang
# simulator (`tokenmill sim`). Targets:
#   runtime (default)  Node.js 20 and the compiled CLI.
#   train              runtime + Python 3 and PyTorch, for `worker --role train` on GPU nodes.
#
#   docker build -t tokenmill:local .
#   docker build --target train -t tokenmill-train:local .
# docker-compose.yml builds both.

ARG NODE_IMAGE=node:20-slim

# --- build: install every dependency, compile TypeScript, then drop the dev dependencies ------
FROM ${NODE_IMAGE} AS build
WORKDIR /app
# Dependencies first, so that a source change does not reinstall them. Lifecycle scripts are
# skipped here because `prepare` compiles the sources, which are not copied yet.
COPY package.json package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY scripts ./scripts
COPY src ./src
# `npm run build` = tsc -p tsconfig.build.json + copy the Lua scripts into dist/.
RUN npm run build && npm prune --omit=dev --no-audit --no-fund

# --- base: what every tokenmill process needs at run time ------------------------------------
FROM ${NODE_IMAGE} AS base
ENV NODE_ENV=production
WORKDIR /app
COPY --from=build /app/package.json /app/package-lock.json ./
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY bin ./bin
COPY data ./data
# trainers/ holds the reference trainer; the wildcard lets the build go on in a checkout
# without it (BuildKit, which the syntax line above selects, allows a COPY matching nothing).
COPY trainer[s] ./trainers/
# Mount points. A named volume mounted on an empty folder takes the folder's owner, so the
# output volume is writable by the unprivileged `node` user (uid 1000) of the base image.
RUN mkdir -p /app/trainers /config /data/out /data/prompts /models && chown node:node /data/out
# Node.js handles SIGTERM itself (graceful shutdown: hand back in-flight prompts, close
# queues, then Redis); Compose adds `init: true` to reap the children of the train worker.
ENTRYPOINT ["node", "/app/bin/tokenmill.js"]
CMD ["--help"]

# --- train: runtime + Python and PyTorch for the train stage ---------------------------------
FROM base AS train
ARG TORCH_VERSION=2.13.0
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/venv
ENV PATH=/opt/venv/bin:$PATH
# The PyPI wheels of torch for Linux x86_64 bundle the CUDA runtime; the NVIDIA container
# toolkit provides the driver and nvidia-smi at run time.
RUN python3 -m venv /opt/venv \
 && pip install --no-cache-dir --disable-pip-version-check "torch==${TORCH_VERSION}" \
 && if [ -f /app/trainers/requirements.txt ]; then \
      pip install --no-cache-dir --disable-pip-version-check -r /app/trainers/requirements.txt; \
    fi
USER node

# --- runtime (default target) -----------------------------------------------------------------
FROM base AS runtime
USER node
