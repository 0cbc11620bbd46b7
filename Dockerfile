# syntax=docker/dockerfile:1.7
#
# One image for every llmq binary; the container's command picks the binary:
#   docker run ghcr.io/llmq/llmq:dev producer serve
#   docker run ghcr.io/llmq/llmq:dev consumer run
#   docker run ghcr.io/llmq/llmq:dev llmsim --addr 0.0.0.0:8000 --config /etc/llmsim/sim.yaml
# docker-compose.yml tags the build ghcr.io/llmq/llmq:dev; deploy/k8s pins a
# release tag of the same repository (deploy/check checks both).

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
ENV CGO_ENABLED=0
ARG TARGETOS=linux
ARG TARGETARCH=amd64
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags "-s -w" -o /out/producer ./cmd/producer && \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags "-s -w" -o /out/consumer ./cmd/consumer && \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags "-s -w" -o /out/llmsim ./cmd/llmsim && \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags "-s -w" -o /out/llmq ./cmd/llmq && \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags "-s -w" -o /out/healthprobe ./deploy/healthprobe

FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="llmq" \
      org.opencontainers.image.source="https://github.com/llmq/llmq" \
      org.opencontainers.image.description="Rate-controlled asynchronous LLM job pipeline"
COPY --from=build /out/producer /out/consumer /out/llmsim /out/llmq /out/healthprobe /usr/local/bin/
ENV PATH=/usr/local/bin:/usr/bin:/bin
USER 65532:65532
EXPOSE 8080 9100
CMD ["llmq", "--help"]
