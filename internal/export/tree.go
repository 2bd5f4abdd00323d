package export

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/spans"
)

// TreeConfig tunes the terminal tree exporter. Zero fields take the defaults.
type TreeConfig struct {
	// Grace is how long a finished rollout (or root span) waits for children
	// that end after it or arrive in a later batch (750ms).
	Grace time.Duration
	// IdleTimeout prints a trace with no finished root of its own (its parent
	// lives in an untraced process) once no span has arrived for it this long
	// (10s).
	IdleTimeout time.Duration
	// MaxSpans bounds the spans held while waiting (50000); past it the
	// oldest trace is printed as it is.
	MaxSpans int
	// Color adds ANSI colours (errors red, names bold); for a terminal.
	Color  bool
	Logger *slog.Logger
}

// TreeExporter is the embedded default: it prints each finished rollout, or
// each finished root span when there is no rollout, as an indented tree.
// Spans arrive finished, children before their parents, so it holds them by
// trace until the unit's top span has ended and a grace period has passed.
type TreeExporter struct {
	cfg TreeConfig
	w   io.Writer
	log *slog.Logger

	mu      sync.Mutex
	traces  map[trace.TraceID]*pendingTrace
	held    int
	stop    chan struct{}
	stopped chan struct{}
	once    sync.Once
	werr    bool
}

type pendingTrace struct {
	id       trace.TraceID
	spans    map[trace.SpanID]*spans.Span
	units    map[trace.SpanID]time.Time // unit top span -> when to print it
	first    time.Time
	lastSeen time.Time
}

// NewTree prints to w (usually os.Stdout, or the status line's writer).
func NewTree(w io.Writer, cfg TreeConfig) *TreeExporter {
	t := newTree(w, cfg)
	go t.loop()
	return t
}

// newTree makes an exporter without its timer goroutine (tests drive it).
func newTree(w io.Writer, cfg TreeConfig) *TreeExporter {
	if cfg.Grace <= 0 {
		cfg.Grace = 750 * time.Millisecond
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 10 * time.Second
	}
	if cfg.MaxSpans <= 0 {
		cfg.MaxSpans = 50000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &TreeExporter{
		cfg:     cfg,
		w:       w,
		log:     cfg.Logger.With("component", "export.tree"),
		traces:  make(map[trace.TraceID]*pendingTrace),
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
}

func (t *TreeExporter) loop() {
	defer close(t.stopped)
	tick := time.NewTicker(min(t.cfg.Grace/4, 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case now := <-tick.C:
			t.flushDue(now)
		}
	}
}

// Export holds the spans until their rollout or root is complete.
func (t *TreeExporter) Export(_ context.Context, batch []spans.Span) error {
	t.add(time.Now(), batch)
	return nil
}

// Shutdown prints everything still held: due units first, then what is still
// open (marked so), and stops the timer.
func (t *TreeExporter) Shutdown(context.Context) error {
	t.once.Do(func() {
		close(t.stop)
	})
	t.mu.Lock()
	defer t.mu.Unlock()
	var buf bytes.Buffer
	t.printDueLocked(&buf, time.Now().Add(t.cfg.Grace+t.cfg.IdleTimeout), false)
	for _, pt := range t.sortedTraces() {
		t.printFragmentLocked(&buf, pt, "open at shutdown")
	}
	t.writeLocked(buf.Bytes())
	return nil
}

func (t *TreeExporter) add(now time.Time, batch []spans.Span) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range batch {
		s := batch[i] // a copy: the caller's slice is not ours to keep
		s.Attrs = Sanitize(s.Attrs)
		pt := t.traces[s.TraceID]
		if pt == nil {
			pt = &pendingTrace{
				id:    s.TraceID,
				spans: make(map[trace.SpanID]*spans.Span),
				units: make(map[trace.SpanID]time.Time),
				first: now,
			}
			t.traces[s.TraceID] = pt
		}
		if _, dup := pt.spans[s.SpanID]; !dup {
			t.held++
		}
		pt.spans[s.SpanID] = &s
		pt.lastSeen = now
		if !s.Parent.IsValid() || rolloutTop(&s) {
			pt.units[s.SpanID] = now.Add(t.cfg.Grace)
		}
	}
	if t.held > t.cfg.MaxSpans {
		var buf bytes.Buffer
		for t.held > t.cfg.MaxSpans && len(t.traces) > 0 {
			oldest := t.sortedTraces()[0]
			t.printFragmentLocked(&buf, oldest, "printed early: too many spans waiting")
		}
		t.writeLocked(buf.Bytes())
	}
}

// rolloutTop reports whether s is where a rollout starts in its process: the
// agent's POST /run server span, or gym.rollout when the server group is off.
func rolloutTop(s *spans.Span) bool {
	if s.Name == "gym.rollout" {
		return true
	}
	return s.Kind == trace.SpanKindServer && attrString(s, "http.route") == "/run"
}

// flushDue prints every unit whose grace period has passed at now, and traces
// idle for IdleTimeout.
func (t *TreeExporter) flushDue(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var buf bytes.Buffer
	t.printDueLocked(&buf, now, true)
	t.writeLocked(buf.Bytes())
}

func (t *TreeExporter) printDueLocked(buf *bytes.Buffer, now time.Time, idle bool) {
	for _, pt := range t.sortedTraces() {
		var due []trace.SpanID
		for id, at := range pt.units {
			if !at.After(now) {
				due = append(due, id)
			}
		}
		slices.SortFunc(due, func(a, b trace.SpanID) int { return pt.spans[a].Start.Compare(pt.spans[b].Start) })
		for _, id := range due {
			delete(pt.units, id)
			top, ok := pt.spans[id]
			if !ok || pt.hasUnitAncestor(top) {
				continue // printed already, or will be with the unit above it
			}
			t.printUnitLocked(buf, pt, []*spans.Span{top}, "")
		}
		if idle && len(pt.spans) > 0 && len(pt.units) == 0 && now.Sub(pt.lastSeen) >= t.cfg.IdleTimeout {
			t.printFragmentLocked(buf, pt, "no root seen")
		}
		if len(pt.spans) == 0 {
			delete(t.traces, pt.id)
		}
	}
}

// hasUnitAncestor reports whether an ancestor of s held in pt is itself a
// unit waiting to be printed.
func (pt *pendingTrace) hasUnitAncestor(s *spans.Span) bool {
	seen := 0
	for p := s.Parent; p.IsValid() && seen < len(pt.spans); seen++ {
		ps, ok := pt.spans[p]
		if !ok {
			return false
		}
		if _, ok := pt.units[p]; ok {
			return true
		}
		p = ps.Parent
	}
	return false
}

// printFragmentLocked prints whatever pt holds, every span whose parent is not
// held being a top.
func (t *TreeExporter) printFragmentLocked(buf *bytes.Buffer, pt *pendingTrace, note string) {
	var tops []*spans.Span
	for _, s := range pt.spans {
		if _, ok := pt.spans[s.Parent]; !ok || !s.Parent.IsValid() {
			tops = append(tops, s)
		}
	}
	if len(tops) == 0 { // a parent cycle: bad input, but print it anyway
		for _, s := range pt.spans {
			tops = append(tops, s)
		}
	}
	t.printUnitLocked(buf, pt, tops, note)
	clear(pt.units)
	delete(t.traces, pt.id)
}

// printUnitLocked prints the subtrees under tops and forgets their spans.
func (t *TreeExporter) printUnitLocked(buf *bytes.Buffer, pt *pendingTrace, tops []*spans.Span, note string) {
	children := make(map[trace.SpanID][]*spans.Span)
	for _, s := range pt.spans {
		if s.Parent.IsValid() && s.Parent != s.SpanID {
			children[s.Parent] = append(children[s.Parent], s)
		}
	}
	byStart := func(a, b *spans.Span) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	}
	slices.SortFunc(tops, byStart)
	for _, c := range children {
		slices.SortFunc(c, byStart)
	}

	r := treeRender{t: t, children: children, visited: make(map[trace.SpanID]bool)}
	r.origin = tops[0].Start
	end := tops[0].End
	for _, s := range tops {
		end = later(end, s.End)
	}
	// The header names the service; rows name it again only where it changes.
	head := tops[0]
	for i, s := range tops {
		r.walk(s, "", i == len(tops)-1, ServiceName(head.Proc))
	}

	// Header: trace id, rollout id if any span carries it, service, duration.
	var sb strings.Builder
	sb.WriteString(t.bold("trace " + shortID(pt.id.String())))
	if id := r.rollout; id != "" {
		sb.WriteString(" rollout " + id)
	} else {
		sb.WriteString(" " + head.Name)
	}
	fmt.Fprintf(&sb, " (%s) %s", ServiceName(head.Proc), fmtDur(end.Sub(r.origin)))
	if len(r.rows) != 1 {
		fmt.Fprintf(&sb, ", %d spans", len(r.rows))
	}
	if note != "" {
		sb.WriteString(" [" + note + "]")
	}
	buf.WriteString(sb.String())
	buf.WriteByte('\n')
	r.writeRows(buf)

	for id := range r.visited {
		delete(pt.spans, id)
		delete(pt.units, id)
		t.held--
	}
}

type treeRow struct {
	left  string // tree prefix, name, service when it changes
	right string // offset, duration, status
}

type treeRender struct {
	t        *TreeExporter
	children map[trace.SpanID][]*spans.Span
	visited  map[trace.SpanID]bool
	origin   time.Time
	rollout  string
	rows     []treeRow
}

func (r *treeRender) walk(s *spans.Span, prefix string, last bool, parentService string) {
	if r.visited[s.SpanID] {
		return
	}
	r.visited[s.SpanID] = true
	if r.rollout == "" {
		r.rollout = attrString(s, "nemo.gym.rollout.id")
	}
	branch, indent := "├─ ", "│  "
	if last {
		branch, indent = "└─ ", "   "
	}
	left := prefix + branch + r.t.bold(s.Name)
	if s.Kind == trace.SpanKindClient {
		if u := attrString(s, "url.full"); u != "" {
			left += " → " + strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://")
		}
	}
	svc := ServiceName(s.Proc)
	if svc != parentService {
		left += "  " + r.t.dim(svc)
	}
	right := fmt.Sprintf("%7s %7s", "+"+fmtDur(s.Start.Sub(r.origin)), fmtDur(s.End.Sub(s.Start)))
	if code := attrString(s, "http.response.status_code"); code != "" {
		right += "  " + code
	}
	if s.Status == codes.Error {
		msg := "ERROR"
		if s.StatusMsg != "" {
			msg += ": " + s.StatusMsg
		}
		right += "  " + r.t.red(msg)
	}
	if truncated(s) {
		right += "  (truncated)"
	}
	r.rows = append(r.rows, treeRow{left: left, right: right})
	kids := r.children[s.SpanID]
	for i, c := range kids {
		r.walk(c, prefix+indent, i == len(kids)-1, svc)
	}
}

// maxLeft caps the aligned column so one long URL does not push every
// duration off screen.
const maxLeft = 80

func (r *treeRender) writeRows(buf *bytes.Buffer) {
	width := 0
	for _, row := range r.rows {
		width = max(width, min(visibleLen(row.left), maxLeft))
	}
	for _, row := range r.rows {
		buf.WriteString(row.left)
		if pad := width - visibleLen(row.left); pad > 0 {
			buf.WriteString(strings.Repeat(" ", pad))
		}
		buf.WriteString("  ")
		buf.WriteString(row.right)
		buf.WriteByte('\n')
	}
}

// visibleLen is the width of s on a terminal: runes, without ANSI escapes.
func visibleLen(s string) int {
	n := 0
	for i := 0; i < len(s); {
		if s[i] == 0x1b {
			j := strings.IndexByte(s[i:], 'm')
			if j < 0 {
				break
			}
			i += j + 1
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
		n++
	}
	return n
}

func (t *TreeExporter) sortedTraces() []*pendingTrace {
	out := make([]*pendingTrace, 0, len(t.traces))
	for _, pt := range t.traces {
		out = append(out, pt)
	}
	slices.SortFunc(out, func(a, b *pendingTrace) int {
		if c := a.first.Compare(b.first); c != 0 {
			return c
		}
		return bytes.Compare(a.id[:], b.id[:])
	})
	return out
}

func (t *TreeExporter) writeLocked(b []byte) {
	if len(b) == 0 {
		return
	}
	if _, err := t.w.Write(b); err != nil && !t.werr {
		t.werr = true // once: a closed terminal would otherwise log per trace
		t.log.Warn("printing trace trees failed", "error", err)
	}
}

func (t *TreeExporter) bold(s string) string {
	if !t.cfg.Color {
		return s
	}
	return "\x1b[1m" + s + "\x1b[0m"
}

func (t *TreeExporter) dim(s string) string {
	if !t.cfg.Color {
		return s
	}
	return "\x1b[2m" + s + "\x1b[0m"
}

func (t *TreeExporter) red(s string) string {
	if !t.cfg.Color {
		return s
	}
	return "\x1b[31m" + s + "\x1b[0m"
}

func shortID(hex string) string {
	if len(hex) > 8 {
		return hex[:8] + "…"
	}
	return hex
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// fmtDur prints a duration compactly: 350µs, 12ms, 812ms, 1.24s, 2m05s.
func fmtDur(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + fmtDur(-d)
	case d == 0:
		return "0ms"
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d/time.Microsecond)
	case d < time.Second:
		return fmt.Sprintf("%dms", d/time.Millisecond)
	case d < time.Minute:
		return fmt.Sprintf("%.2fs", d.Seconds())
	default:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int((d%time.Minute)/time.Second))
	}
}
