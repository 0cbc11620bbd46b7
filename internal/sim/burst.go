package sim

// check applies the growth-rate rule documented on BurstConfig at now to a
// request of need tokens: it reports whether the request fits, how long
// until the last second would have room if not, and the threshold in force
// (requests per second, or tokens per second when the token rule refused).
func (b BurstConfig) check(l *eventLog, now, need int64) (ok bool, wait, threshold int64) {
	first, last1s, tok1s := l.window(now, second)
	w := int64(b.Window)
	prev, prevTok := l.span(now-second-w, now-second)
	perSec := float64(second) / float64(w)
	thr := max(float64(b.Floor), b.Growth*float64(prev)*perSec)
	if float64(last1s+1) > thr {
		// The last second frees a slot when its oldest request leaves it
		// (the threshold may move meanwhile; callers re-check).
		return false, max(l.at(first).t+second-now, 1), int64(thr)
	}
	if b.TokenFloor > 0 && last1s > 0 {
		thrTok := int64(max(float64(b.TokenFloor), b.Growth*float64(prevTok)*perSec))
		if tok1s+need > thrTok {
			wait := l.at(first).t + second - now // the whole second, if need alone is over
			if need <= thrTok {
				_, wait = l.tokenWait(now, second, thrTok, need)
			}
			return false, max(wait, 1), thrTok
		}
	}
	return true, 0, int64(thr)
}
