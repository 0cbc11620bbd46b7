package store

// byKey is the WHERE clause of a statement that changes rows of jobs named
// by key: it joins jobs to alias's tenant and id and checks cond on each
// row reached. cond sits inside a CASE, which the planner neither uses to
// choose an index nor matches against a partial index's predicate, so
// the rows are reached through jobs_pkey, one probe per key, whatever the
// statistics say.
//
// Written plainly, a status in cond (status = 'queued', status = ANY(...))
// implies the predicates of the partial indexes on unfinished rows
// (jobs_backlog_idx, jobs_parked_idx), and the planner then weighs a scan
// of one of them against the key probes by the size it believes that
// index has. Statistics gathered while nothing was waiting (after a quiet
// spell, a fresh install's first ANALYZE) put it at one row, and when a
// flood then fills it, each claim, completion or unpark of a few keys
// scans the whole backlog: the statement's cost grows with the backlog,
// and draining it costs its square (BENCHMARKS.md, "Plans that do not
// trust the statistics"). A concurrent change to a row is handled as
// before: the row is re-read and cond checked again on its new version.
func byKey(alias, cond string) string {
	return `jobs.tenant = ` + alias + `.tenant AND jobs.id = ` + alias + `.id
		AND CASE WHEN ` + cond + ` THEN true ELSE false END`
}
