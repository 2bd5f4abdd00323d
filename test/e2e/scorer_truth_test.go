//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
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

type joinKey struct {
	pid, port, serverPort int
}

// matchByPorts pairs records with spans one to one. Candidates share the key
// (process and the connection's ports); a keep-alive connection carries its
// requests one after another, so among candidates whose intervals overlap
// (with slack) the pairs closest in start and end win, globally greedy.
func matchByPorts(recs []truthRec, recKey func(truthRec) (joinKey, bool),
	spans []Span, spanKey func(Span) (joinKey, bool)) map[int]int {
	byKey := map[joinKey][]int{}
	for i, s := range spans {
		if k, ok := spanKey(s); ok {
			byKey[k] = append(byKey[k], i)
		}
	}
	type cand struct {
		rec, span int
		cost      int64
	}
	var cands []cand
	for ri, r := range recs {
		k, ok := recKey(r)
		if !ok {
			continue
		}
		for _, si := range byKey[k] {
			s := spans[si]
			ss, se := int64(s.Start), int64(s.End)
			endCost := abs64(se - r.TEnd)
			if s.Attr("gymtrace.record.lost") != "" || s.Attributes["nemo.span.truncated"] == true {
				// Its response record was lost (the span ends with its
				// request) or never came before shutdown (the span ends
				// then): when the response really ended is unknown.
				se, endCost = max(se, r.TEnd), 0
			}
			if ss > r.TEnd+matchSlack || r.TStart > se+matchSlack {
				continue
			}
			cands = append(cands, cand{ri, si, abs64(ss-r.TStart) + endCost})
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].cost != cands[j].cost {
			return cands[i].cost < cands[j].cost
		}
		if cands[i].rec != cands[j].rec {
			return cands[i].rec < cands[j].rec
		}
		return cands[i].span < cands[j].span
	})
	out := map[int]int{}
	used := map[int]bool{}
	for _, c := range cands {
		if _, done := out[c.rec]; done || used[c.span] {
			continue
		}
		out[c.rec] = c.span
		used[c.span] = true
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
