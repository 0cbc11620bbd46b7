// Command healthprobe is the container healthcheck of the llmq image: the
// final stage is distroless (no shell, no curl), so docker-compose
// healthchecks run `healthprobe URL`, which exits 0 when GET URL answers
// 2xx within two seconds and 1 otherwise.
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	if err := probe(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "healthprobe:", err)
		os.Exit(1)
	}
}

func probe(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: healthprobe http://127.0.0.1:PORT/PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("get %s: %w", args[0], err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("get %s: status %d", args[0], resp.StatusCode)
	}
	return nil
}
