// Package api is the producer's HTTP API (docs/design.md#http-api): job
// submission with idempotent IDs, polling, listing, cancellation, the
// dead-letter queue, back-pressure status, metrics and health.
//
// Contract details this package decides:
//   - The contract is api/openapi.yaml (served at GET /v1/openapi.yaml, its
//     schemas at GET /v1/schemas/{name}): the tests hold it to routes, the
//     registration table, and to every status and body the handlers answer
//     during them (contract_test.go).
//   - Auth: every /v1 route but those documents needs "Authorization: Bearer
//     <key>"; keys are compared in constant time over all of them. A tenant
//     key (config.APIKeys) acts for its tenant only; an admin key
//     (admin_keys) acts for any tenant, named by ?tenant= (default
//     "default") or, on a submission, by the body's "tenant", and may read
//     /metrics (roles.go). With no keys configured the server is for
//     loopback only and every request is an admin's of tenant "default" (the
//     caller of CheckListenAddr enforces the loopback rule at start).
//   - A tenant key's tenant comes from the key. A body whose "tenant"
//     differs from it is rejected with 400 invalid_job (field "tenant"); a
//     body naming the key's own tenant is accepted. A ?tenant= naming
//     another tenant answers 404 on a route by id, 403 forbidden elsewhere.
//   - POST /v1/jobs answers 202 {"id","status":"queued"} when it created the
//     job: 202 means the row is in Postgres AND the broker confirmed the
//     message. A re-submission of an existing (tenant, id) creates nothing and
//     answers 200 with the existing job's id and current status.
//   - Another tenant's job answers 404 not_found exactly like a missing one.
//   - Errors are {"error":{"code","field"?,"message"}} with stable codes:
//     unauthorized, forbidden, invalid_job, invalid_request, not_found, conflict,
//     payload_too_large, backpressure, broker_unavailable, store_unavailable,
//     internal.
//   - Back-pressure: the status (backlog per lane as the larger of the broker
//     depth and the Postgres backlog, drain rate over the last minute, time to
//     drain) is cached and refreshed about every second by Run; submissions
//     that would take the backlog over the hard limit get 429 with
//     Retry-After computed from the measured drain rate. Each tenant with a
//     backlog_limit is held to it too, with a Retry-After from its own
//     drain rate (tenant_status.go); GET /v1/status shows a tenant key its
//     own numbers only, and llmq.status every limited tenant's state.
package api
