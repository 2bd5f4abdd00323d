//go:build linux

package preflight

// injectSelfTest: does a socket in a sockhash report its state as it does
// outside one? Where not, gymtrace keeps traceparent injection off.
func (c *checker) injectSelfTest() {
	if c.o.InjectSelfTest == nil {
		return
	}
	r := Result{Feature: "injection self-test (sockhash)", Need: NeedOptional}
	safe, detail, err := c.o.InjectSelfTest()
	switch {
	case err != nil:
		r.Status, r.Detail = StatusMissing, err.Error()
		r.Fix = "needs CAP_BPF and CAP_NET_ADMIN (see the capability rows); gymtrace keeps traceparent injection off when it cannot run this test"
	case !safe:
		r.Status, r.Detail = StatusMissing, detail
		r.Fix = "gymtrace keeps traceparent injection off here (traces do not join across nodes); a kernel with the fix, " +
			"or --inject-force to inject and let the traced programs see the misreport"
	default:
		r.Status, r.Detail = StatusOK, detail
	}
	c.add(r)
}
