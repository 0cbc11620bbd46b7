package sim

// check applies the growth-rate rule documented on BurstConfig at now: it
// reports whether one more request fits, how long until the last second
// would have room if not, and the threshold in force.
func (b BurstConfig) check(l *eventLog, now int64) (ok bool, wait, threshold int64) {
	first, last1s, _ := l.window(now, second)
	w := int64(b.Window)
	prev, _ := l.span(now-second-w, now-second)
	avg := float64(prev) * float64(second) / float64(w)
	thr := max(float64(b.Floor), b.Growth*avg)
	if float64(last1s+1) <= thr {
		return true, 0, int64(thr)
	}
	// The last second frees a slot when its oldest request leaves it (the
	// threshold may move meanwhile; callers re-check).
	wait = l.at(first).t + second - now
	return false, max(wait, 1), int64(thr)
}
