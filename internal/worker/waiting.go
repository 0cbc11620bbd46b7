package worker

// Waiting is, per model this replica has started a dispatcher for, the
// claimed jobs waiting for admission (the replica snapshots of the
// console: internal/replicastat).
func (w *Worker) Waiting() map[string]int {
	w.mu.Lock()
	ds := make([]*dispatcher, 0, len(w.dispatchers))
	for _, d := range w.dispatchers {
		ds = append(ds, d)
	}
	w.mu.Unlock()
	out := make(map[string]int, len(ds))
	for _, d := range ds {
		d.mu.Lock()
		out[d.model] = d.q.Len()
		d.mu.Unlock()
	}
	return out
}
