package api

// RoutePatterns returns the patterns of s's registration table (routes),
// in registration order: the OpenAPI test holds api/openapi.yaml to them.
func RoutePatterns(s *Server) []string {
	var out []string
	for _, rt := range s.routes() {
		out = append(out, rt.pattern)
	}
	return out
}
