//go:build linux

package spans

import (
	"sync"

	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// Pipeline is the userspace path of one record: ring-buffer bytes -> Decode ->
// Assembler -> Builder -> finished spans. Safe for concurrent use (the reader
// loop, a timer calling Expire, and shutdown calling Flush).
type Pipeline struct {
	mu        sync.Mutex
	ev        loader.HTTPEvent // reused: Decode copies into it
	asm       *http.Assembler
	b         *Builder
	decodeErr uint64
}

// PipelineStats gathers the counters of every stage.
type PipelineStats struct {
	DecodeErrors uint64
	Assembler    http.AssemblerStats
	Builder      Stats
}

// NewPipeline joins an Assembler and a Builder.
func NewPipeline(a *http.Assembler, b *Builder) *Pipeline { return &Pipeline{asm: a, b: b} }

// Builder returns the pipeline's Builder (SetMask, BindContext, Stats).
func (p *Pipeline) Builder() *Builder { return p.b }

// Process consumes one ring-buffer record and returns the spans it finished
// (usually none or one or two; the caller owns the slice). A record that does
// not decode is counted and returned as an error; nothing else changes.
func (p *Pipeline) Process(raw []byte) ([]Span, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(raw) > 0 && raw[0] == loader.EvGenAI {
		ev, g, ok := http.DecodeGenAI(raw)
		if !ok {
			p.decodeErr++
			return nil, &http.DecodeError{Reason: "a GenAI record that does not decode"}
		}
		p.asm.AddGenAI(ev.ConnId, ev.Seq, g)
		return nil, nil
	}
	if err := http.DecodeInto(&p.ev, raw); err != nil {
		p.decodeErr++
		return nil, err
	}
	p.asm.Add(&p.ev, p.b)
	return p.b.Take(), nil
}

// ProcessEvent is Process for an already decoded record.
func (p *Pipeline) ProcessEvent(ev *loader.HTTPEvent) []Span {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asm.Add(ev, p.b)
	return p.b.Take()
}

// Expire ends exchanges that waited longer than the Assembler's MaxAge, as
// truncated spans. Call it from a timer (e.g. every 10 s) with the Builder's
// clock NowMono, so state is bounded even when no records arrive.
func (p *Pipeline) Expire(nowMono uint64) []Span {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asm.Expire(nowMono, p.b)
	return p.b.Take()
}

// Flush ends everything still in flight now, with nemo.span.truncated=true,
// and returns every span not yet taken. For shutdown.
func (p *Pipeline) Flush() []Span {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asm.Drain(p.b.opt.Clock.NowMono(), http.ErrShutdown, p.b)
	return p.b.Flush()
}

// Stats returns the counters of every stage.
func (p *Pipeline) Stats() PipelineStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PipelineStats{DecodeErrors: p.decodeErr, Assembler: p.asm.Stats(), Builder: p.b.Stats()}
}
