package api

import "context"

// RoutePatterns returns the patterns of s's registration table (routes),
// in registration order: the OpenAPI test holds api/openapi.yaml to them.
func RoutePatterns(s *Server) []string {
	var out []string
	for _, rt := range s.routes() {
		out = append(out, rt.pattern)
	}
	return out
}

// RefreshOverview reads the replica snapshots now (Run does this every
// second).
func RefreshOverview(s *Server, ctx context.Context) error { return s.hub.refresh(ctx) }
