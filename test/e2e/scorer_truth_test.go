//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// --- ground truth ----------------------------------------------------------------

// truthAddr is a truth address, [host, port] in the file.
type truthAddr struct {
	Host string
	Port int
}

func (a *truthAddr) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*a = truthAddr{}
		return nil
	}
	var pair []any
	if err := json.Unmarshal(b, &pair); err != nil {
		return fmt.Errorf("address %s is not [host, port]: %w", b, err)
	}
	if len(pair) != 2 {
		return fmt.Errorf("address %s is not [host, port]", b)
	}
	a.Host = anyString(pair[0])
	a.Port = anyInt(pair[1])
	return nil
}

// truthRec is one ground-truth line.
type truthRec struct {
	Ev        string    `json:"ev"`
	ID        string    `json:"id"`
	Cause     string    `json:"cause"` // "" for null (the collector's calls)
	Method    string    `json:"method"`
	Path      string    `json:"path"`
	Route     string    `json:"route"`
	Local     truthAddr `json:"local"`
	Peer      truthAddr `json:"peer"`
	Remote    truthAddr `json:"remote"`
	Status    int       `json:"status"`
	Error     string    `json:"error"`
	RolloutID string    `json:"rollout_id"`
	// resources /verify (test/stack --rewards): what it answered.
	Reward        *float64 `json:"reward"`
	RewardText    string   `json:"reward_text"`
	VerifyOutcome string   `json:"verify_outcome"`
	BodyBytes     int      `json:"body_bytes"`
	ChildPID      int      `json:"child_pid"`
	TStart        int64    `json:"t_start"`
	TEnd          int64    `json:"t_end"`
	MonoStart     int64    `json:"mono_start"`
	MonoEnd       int64    `json:"mono_end"`
	Verb          string   `json:"verb"`
	Server        string   `json:"server"`
	Type          string   `json:"type"`
	PID           int      `json:"pid"`
}

func (r truthRec) String() string {
	switch r.Ev {
	case "in":
		return fmt.Sprintf("in %s %s %s (pid %d, peer port %d)", r.ID, r.Method, r.Path, r.PID, r.Peer.Port)
	case "out":
		return fmt.Sprintf("out %s %s %s cause=%s (pid %d, local port %d)", r.ID, r.Method, r.Path, r.Cause, r.PID, r.Local.Port)
	}
	return fmt.Sprintf("%s %s (pid %d)", r.Ev, r.ID, r.PID)
}

// readTruth reads a truth file, keeping the records that started at or after
// sinceMono (CLOCK_MONOTONIC ns; 0 keeps all). The stack's processes flush
// every 200 ms, so read it once they have had time to.
func readTruth(path string, sinceMono int64) ([]truthRec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the ground truth: %w", err)
	}
	var out []truthRec
	for i, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r truthRec
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("%s line %d is not a truth record (two stacks writing one file?): %w: %s",
				path, i+1, err, tail(string(line), 200))
		}
		if r.Ev == "start" || r.MonoStart >= sinceMono {
			out = append(out, r)
		}
	}
	return out, nil
}

// --- joining spans to records ----------------------------------------------------

// matchSlack absorbs gymtrace's conversion of kernel monotonic time to wall
// time and the distance between a syscall and the Python line that logged the
// truth.
const matchSlack = int64(2 * time.Millisecond)

// spawnContains: may sandbox span s be the CLI of spawn record r? With the
// span's debug attributes (GYMTRACE_DEBUG_RECORDS) and the record's child pid,
// only the spawn of that pid whose monotonic interval (spawn call to wait)
// contains the CLI's exec and exit: the clock the kernel and the app share,
// which a wall-clock step does not move (one moved every span of a CI case off
// its own spawn and onto concurrent ones). Otherwise any spawn whose wall-time
// interval contains the span.
func spawnContains(r truthRec, s Span) bool {
	pid, start, end := anyInt(s.Attributes["gymtrace.debug.pid"]), anyInt(s.Attributes["gymtrace.debug.start"]),
		anyInt(s.Attributes["gymtrace.debug.end"])
	if pid > 0 && start > 0 && r.ChildPID > 0 && r.MonoStart > 0 {
		return pid == r.ChildPID && int64(start)+matchSlack >= r.MonoStart && int64(end) <= r.MonoEnd+matchSlack
	}
	return int64(s.Start)+matchSlack >= r.TStart && int64(s.End) <= r.TEnd+matchSlack
}

type joinKey struct {
	pid, port, serverPort int
}

// matchByPorts pairs records with spans one to one. Candidates share the key
// (process and the connection's ports). A keep-alive connection carries its
// requests one after another, in the same order in the truth and in the
// kernel, so on each connection the pairing keeps that order: of the
// order-keeping pairings whose pairs the times allow (pairCost), the one
// with the most pairs, then the least cost.
// A greedy pairing by cost alone is not enough: a span whose response record
// was lost ends with its request, so its end says nothing and a later record
// could take it from its own.
func matchByPorts(recs []truthRec, recKey func(truthRec) (joinKey, bool),
	spans []Span, spanKey func(Span) (joinKey, bool)) map[int]int {
	type side struct{ recs, spans []int }
	byKey := map[joinKey]*side{}
	at := func(k joinKey) *side {
		if byKey[k] == nil {
			byKey[k] = &side{}
		}
		return byKey[k]
	}
	for i, s := range spans {
		if k, ok := spanKey(s); ok {
			at(k).spans = append(at(k).spans, i)
		}
	}
	for i, r := range recs {
		if k, ok := recKey(r); ok {
			at(k).recs = append(at(k).recs, i)
		}
	}
	out := map[int]int{}
	for _, sd := range byKey {
		if len(sd.recs) == 0 || len(sd.spans) == 0 {
			continue
		}
		sort.SliceStable(sd.recs, func(a, b int) bool { return recs[sd.recs[a]].TStart < recs[sd.recs[b]].TStart })
		sort.SliceStable(sd.spans, func(a, b int) bool { return spans[sd.spans[a]].Start < spans[sd.spans[b]].Start })
		for ri, si := range alignInOrder(len(sd.recs), len(sd.spans), func(i, j int) (int64, bool) {
			return pairCost(recs[sd.recs[i]], spans[sd.spans[j]])
		}) {
			out[sd.recs[ri]] = sd.spans[si]
		}
	}
	return out
}

// pairCost: whether record r and span s may be a pair (their paths agree and
// their times allow it), and how far apart they are. Where the span carries
// the kernel's own start (gymtrace.debug.req_start) the times are compared
// on the one clock both share (kernelCost); otherwise by wall time, with
// slack.
func pairCost(r truthRec, s Span) (int64, bool) {
	if !samePath(r.Path, s.Path()) {
		return 0, false
	}
	if c, ok, known := kernelCost(r, s); known {
		return c, ok
	}
	ss, se := int64(s.Start), int64(s.End)
	endCost := abs64(se - r.TEnd)
	if s.Attr("gymtrace.record.lost") != "" || s.Attributes["nemo.span.truncated"] == true {
		// Its response record was lost (the span ends with its request)
		// or never came before shutdown (the span ends then): when the
		// response really ended is unknown.
		se, endCost = max(se, r.TEnd), 0
	}
	if ss > r.TEnd+matchSlack || r.TStart > se+matchSlack {
		return 0, false
	}
	return abs64(ss-r.TStart) + endCost, true
}

// kernelCost compares span s's kernel start (CLOCK_MONOTONIC, stamped as
// its syscall returned) with record r's monotonic stamps, which the app takes
// on the same clock: a request is read before its handler begins (r's start
// follows the read), a call is written while it is in progress (between r's
// start and end). The cost is the distance from r's start, so among the
// records a span may belong to its own is the cheapest: on a connection the
// requests follow one another, and a later one starts later.
//
// Wall time cannot do this: a span whose response record was lost has no
// end, so it overlaps every record that ended after it began, and under load
// a handler can begin well after the read while the previous request's began
// just before it (seen in CI: a model SERVER span scored as the request
// before its own, another rollout's, reported as a trace shared by two
// rollouts while gymtrace's join by TCP stream position was right). known
// says whether both sides carry kernel time.
func kernelCost(r truthRec, s Span) (cost int64, ok, known bool) {
	v, has := s.Attributes["gymtrace.debug.req_start"]
	k := int64(anyInt(v))
	if !has || k == 0 || r.MonoStart == 0 || s.Kind != "SERVER" && s.Kind != "CLIENT" {
		return 0, false, false
	}
	cost, ok = monoCost(r, k, s.Kind == "CLIENT")
	return cost, ok, true
}

// monoCost is kernelCost's rule for a kernel stamp k: of a call's write
// (call) or of a request's read.
func monoCost(r truthRec, k int64, call bool) (int64, bool) {
	if call {
		return k - r.MonoStart, r.MonoStart <= k && (r.MonoEnd == 0 || k <= r.MonoEnd)
	}
	return r.MonoStart - k, r.MonoStart >= k
}

// samePath: a request's path as its sender wrote it (truth) and as a span
// names it may be the same request's. Times alone can pair a span with its
// neighbour on a keep-alive connection when a record was lost: a call
// stamped first may be written second, after waiting for the connection
// (seen in a lossy CI run: a /verify span paired with the /seed_session of
// another rollout, a wrong parent that was not). A span whose path is
// unknown, or cut to the kernel's prefix, pairs with any that agrees as far
// as it goes; queries are not compared.
func samePath(truth, span string) bool {
	truth, _, _ = strings.Cut(truth, "?")
	span, _, _ = strings.Cut(span, "?")
	return span == "" || truth == "" || strings.HasPrefix(truth, span) || strings.HasPrefix(span, truth)
}

// alignInOrder pairs items 0..n-1 with 0..m-1 keeping both orders: the
// most pairs, then the least total cost, among pairs cost allows. Returns
// i -> j.
func alignInOrder(n, m int, cost func(i, j int) (int64, bool)) map[int]int {
	type cell struct {
		pairs int
		cost  int64
	}
	better := func(a, b cell) bool { return a.pairs > b.pairs || a.pairs == b.pairs && a.cost < b.cost }
	// best[i][j]: the best alignment of items i.. with items j..
	best := make([][]cell, n+1)
	for i := range best {
		best[i] = make([]cell, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			b := best[i+1][j]
			if c := best[i][j+1]; better(c, b) {
				b = c
			}
			if c, ok := cost(i, j); ok {
				if p := (cell{best[i+1][j+1].pairs + 1, best[i+1][j+1].cost + c}); better(p, b) {
					b = p
				}
			}
			best[i][j] = b
		}
	}
	out := map[int]int{}
	for i, j := 0, 0; i < n && j < m; {
		if c, ok := cost(i, j); ok && best[i][j] == (cell{best[i+1][j+1].pairs + 1, best[i+1][j+1].cost + c}) {
			out[i] = j
			i, j = i+1, j+1
		} else if best[i][j] == best[i+1][j] {
			i++
		} else {
			j++
		}
	}
	return out
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// truthJoin pairs each server-to-server out with the in it produced on the
// other side, exactly as truthcheck.py does: the out's local address is the
// in's peer, the out's remote port the in's local port, and the in lies
// inside the out in monotonic time.
func truthJoin(recs []truthRec) map[string]truthRec {
	byPorts := map[[2]int][]truthRec{}
	for _, r := range recs {
		if r.Ev == "in" && r.Peer.Port != 0 {
			k := [2]int{r.Peer.Port, r.Local.Port}
			byPorts[k] = append(byPorts[k], r)
		}
	}
	out := map[string]truthRec{}
	for _, o := range recs {
		if o.Ev != "out" || o.Error != "" || o.Local.Port == 0 {
			continue
		}
		var found []truthRec
		for _, in := range byPorts[[2]int{o.Local.Port, o.Remote.Port}] {
			if o.MonoStart <= in.MonoStart && in.MonoEnd <= o.MonoEnd {
				found = append(found, in)
			}
		}
		if len(found) == 1 {
			out[o.ID] = found[0]
		}
	}
	return out
}
