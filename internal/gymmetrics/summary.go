package gymmetrics

import (
	"slices"
	"time"
)

// Summary is what the terminal's status line shows of Gym's metrics.
type Summary struct {
	Rollouts               uint64        // rollouts finished (agent /run), all processes
	RolloutP50, RolloutP99 time.Duration // over the last recentRollouts rollouts
	VerifyOK, VerifyAll    uint64        // /verify calls that succeeded, and all of them
}

// recentRollouts is how many rollout times the quantiles are taken over.
const recentRollouts = 1024

type summary struct {
	rollouts            uint64
	recent              [recentRollouts]time.Duration
	n                   int // filled slots of recent
	next                int
	verifyOK, verifyAll uint64
}

func (s *summary) rollout(_ time.Time, d time.Duration) {
	s.rollouts++
	s.recent[s.next] = d
	s.next = (s.next + 1) % recentRollouts
	s.n = min(s.n+1, recentRollouts)
}

func (s *summary) verify(ok bool) {
	s.verifyAll++
	if ok {
		s.verifyOK++
	}
}

// Summary returns the status line's figures.
func (r *Recorder) Summary() Summary {
	r.mu.Lock()
	out := Summary{Rollouts: r.sum.rollouts, VerifyOK: r.sum.verifyOK, VerifyAll: r.sum.verifyAll}
	d := slices.Clone(r.sum.recent[:r.sum.n])
	r.mu.Unlock()
	if len(d) > 0 {
		slices.Sort(d)
		out.RolloutP50 = quantile(d, 0.50)
		out.RolloutP99 = quantile(d, 0.99)
	}
	return out
}

// quantile of sorted d, nearest rank.
func quantile(d []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(d))+0.999999) - 1
	return d[max(0, min(i, len(d)-1))]
}
