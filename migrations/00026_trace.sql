-- +goose Up
-- Tracing (docs/design.md#tracing): the W3C trace context of the request or
-- message that brought a job (its submit or ingest span), written with the
-- row so that a consumer on any replica, the result relay and the webhook
-- dispatcher continue the job's trace. NULL when tracing was off or the
-- caller sent none.
ALTER TABLE jobs ADD COLUMN traceparent text;
ALTER TABLE jobs ADD COLUMN tracestate  text;
ALTER TABLE webhook_deliveries ADD COLUMN traceparent text;
ALTER TABLE webhook_deliveries ADD COLUMN tracestate  text;

-- +goose Down
ALTER TABLE webhook_deliveries DROP COLUMN tracestate;
ALTER TABLE webhook_deliveries DROP COLUMN traceparent;
ALTER TABLE jobs DROP COLUMN tracestate;
ALTER TABLE jobs DROP COLUMN traceparent;
