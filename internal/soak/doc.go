// Package soak is `llmq soak`: the pipeline as real processes (producer
// serve, consumer run ×N) under steady load against llmsim for tens of
// minutes while consumers are SIGKILLed and RabbitMQ and Postgres restart,
// and the account of what became of every job.
//
// The account comes from witnesses that share no code with the pipeline:
// the submitter (which submissions were acknowledged), llmsim (every
// provider call per job id, found in the prompt), a queue of the soak's own
// on llmq.results (every terminal event) and, at the end, Postgres (every
// job's status). Ledger turns them into the verdict: lost (accepted and not
// finished, or finished without its event), duplicated (finished twice: two
// distinct terminal events) and re-paid (the provider answered twice, the
// result stored once).
package soak
