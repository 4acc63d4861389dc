# syntax=docker/dockerfile:1
# Multi-stage: a static sluice binary on a distroless base, running as non-root.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# -tags nodev: the production build, without `sluice dev` and its in-process Redis.
RUN CGO_ENABLED=0 go build -tags nodev -trimpath -ldflags="-s -w" -o /out/sluice ./cmd/sluice

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sluice /usr/local/bin/sluice
USER nonroot:nonroot
EXPOSE 9090 8081
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["worker"]
