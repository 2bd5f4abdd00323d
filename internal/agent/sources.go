//go:build linux

package agent

import (
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/metrics"
)

// What the agent reports about itself: the Prometheus self-metrics and the
// terminal status line.

func (t *agent) kernelStats() []uint64 {
	st, err := t.kern.Stats()
	if err != nil {
		return make([]uint64, loader.StatMax)
	}
	return st
}

func (t *agent) metricSources() metrics.Sources {
	perGroup := func(base uint32) func() map[string]uint64 {
		return func() map[string]uint64 {
			st := t.kernelStats()
			out := map[string]uint64{}
			for _, info := range groups.All() {
				out[info.Name] = st[base+uint32(info.Group)]
			}
			return out
		}
	}
	return metrics.Sources{
		EventsEmitted:          perGroup(loader.StatEmitted),
		EventsDiscarded:        perGroup(loader.StatDiscarded),
		RingbufReserveFailures: func() uint64 { return t.kernelStats()[loader.StatRingbufFull] },
		RecordsRead:            func() uint64 { return t.records.Load() },
		KernelCounters: func() map[string]uint64 {
			out := kernelCounters(t.kernelStats())
			injectCounters(t.inj, out)
			out["program_skipped"] = loader.SkippedRuns(loader.LoadedPrograms(t.kern.Programs()))
			return out
		},
		PythonContext: func() map[string]uint64 {
			st, err := t.kern.PyStats()
			if err != nil {
				return nil
			}
			return st
		},
		SpansBuilt: func() map[string]uint64 {
			st := t.spans.Builder().Stats()
			out := map[string]uint64{}
			for _, info := range groups.All() {
				out[info.Name] = st.Spans[info.Group]
			}
			return out
		},
		Joins: func() map[string]uint64 {
			st := t.spans.Builder().Stats()
			return map[string]uint64{"traceparent": st.JoinedTraceparent, "connection": st.JoinedTuple, "stream": st.JoinedStream,
				"index": st.JoinedIndex, "unprovable": st.JoinUnprovable,
				"late": st.LateJoins, "after_end": st.JoinedAfterEnd, "awaited": st.AwaitedClient, "wait_expired": st.LateExpired}
		},
		ParentUnresolved: func() map[string]uint64 {
			st := t.spans.Builder().Stats()
			return map[string]uint64{"ambiguous": st.ParentAmbiguous, "request_not_traced": st.ParentNotTraced,
				"context_unbound": st.ParentUnbound, "records_lost": st.ParentRecordsLost, "cause_after_call": st.ParentImpossible}
		},
		ParentResolved: func() map[string]uint64 {
			st := t.spans.Builder().Stats()
			return map[string]uint64{"context": st.ParentByContext, "nesting": st.ParentByNesting, "only_in_flight": st.ParentOnlyInFlight}
		},
		ParentNoContext: func() uint64 { return t.spans.Builder().Stats().ParentNoContext },
		Roles: func() metrics.RoleStats {
			st := t.spans.Builder().Stats()
			return metrics.RoleStats{Inferred: st.RoleInferred, Held: st.Held, Undecided: st.RoleUndecided, GymUnresolved: st.GymSpanUnresolved}
		},
		Export: func() metrics.ExportStats { return metrics.ExportStats(t.out.Stats()) },
		Gym: func() metrics.GymStats {
			if t.gym == nil {
				return metrics.GymStats{}
			}
			return metrics.GymStats(t.gym.Stats())
		},
		TargetsAttached: t.targetCount,
		Injection:       t.injState.get,
		FeaturesOff: func() map[string]string {
			out := map[string]string{}
			for _, u := range t.kern.Off() {
				out[u.Feature] = u.Needs
			}
			return out
		},
	}
}

// kernelCounters names the kernel's other counters for
// gymtrace_kernel_events_total{reason}.
func kernelCounters(st []uint64) map[string]uint64 {
	return map[string]uint64{
		"not_http":      st[loader.StatNotHTTP],
		"parse_error":   st[loader.StatParseError],
		"hdr_truncated": st[loader.StatHdrTruncated],
		"conn_full":     st[loader.StatConnFull],
		"resync":        st[loader.StatResync],
		"skipped_bytes": st[loader.StatSkippedBytes],
		"unsampled":     st[loader.StatUnsampled],
		"scan_reused":   st[loader.StatScanReused],   // client request heads not read twice (injection's scan)
		"scan_preread":  st[loader.StatScanPreread],  // header blocks scanned from the read at their message start
		"fresh_conns":   st[loader.StatFresh],        // connections followed from their first byte: joined by order
		"tls_calls":     st[loader.StatTLSCalls],     // OpenSSL probe runs in targets
		"tls_events":    st[loader.StatTLSEvents],    // records from TLS plaintext
		"tls_linked":    st[loader.StatTLSLinked],    // SSL objects tied to their socket
		"reward_found":  st[loader.StatRewardFound],  // /verify responses whose reward the kernel read
		"reward_missed": st[loader.StatRewardMissed], // ... meant to be scanned, with no usable reward (docs/security.md)
		// Bytes of a followed connection that moved unseen (a skipped
		// program, an unhooked syscall): the direction resyncs and pairs
		// nothing by count across the gap; body_gap ones were skipped exactly.
		"stream_gap":      st[loader.StatStreamGap],
		"stream_body_gap": st[loader.StatStreamGapBody],
		// Model exchanges' GenAI fields (request model, response model,
		// input tokens, output tokens), one count per field: read, or why
		// not (bpf/http_genai.h, docs/security.md).
		"genai_read":       st[loader.StatGenAIRead],
		"genai_absent":     st[loader.StatGenAIAbsent],
		"genai_ambiguous":  st[loader.StatGenAIAmbiguous],
		"genai_malformed":  st[loader.StatGenAIMalformed],
		"genai_incomplete": st[loader.StatGenAIIncomplete],
		// Connections whose close went unseen, found when their fd named
		// another socket: ended, and the new one followed afresh.
		"stale_conn": st[loader.StatStaleConn],
		// Events of a syscall program the kernel skipped that its
		// understudy made (bpf/common/understudy.h): nothing lost.
		"program_stood_in": st[loader.StatStoodIn],
		// Response records not written, the ring buffer seven eighths
		// full: its last eighth is kept for requests (a lost response
		// ends its span early; a lost request loses the span).
		"response_shed": st[loader.StatResponseShed],
		// Request records written late, at their handler's first call or
		// their response's first bytes, after the ring buffer had no room
		// when the request ended (counted in the reservation failures
		// then): the span is kept, and the parents of calls whose records
		// came before it are not.
		"request_late": st[loader.StatRequestLate],
	}
}

// statusSnapshot feeds the terminal status line.
func (t *agent) statusSnapshot() metrics.Snapshot {
	st := t.spans.Builder().Stats()
	snap := metrics.Snapshot{Targets: t.targetCount(), Spans: map[string]uint64{}}
	for _, info := range groups.All() {
		if n := st.Spans[info.Group]; n > 0 {
			snap.Spans[info.Name] = n
		}
	}
	if t.gym != nil {
		g := t.gym.Summary()
		snap.Gym = metrics.GymSummary(g)
	}
	ex := t.out.Stats()
	snap.Drops = t.kernelStats()[loader.StatRingbufFull] + ex.Dropped + ex.Failed
	return snap
}
