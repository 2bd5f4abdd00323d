// Package tls traces HTTPS through the TLS library: it finds the OpenSSL
// copies a target process maps (libssl*, or OpenSSL linked into an
// executable or library when its symbols are there), places the uprobes of
// bpf/tls.h on them through /proc/PID/map_files (which works across mount
// namespaces), follows libraries mapped later (a lazy `import ssl`), and
// detaches. The kernel feeds the plaintext to the same HTTP state machine
// and gate as socket bytes; see docs/tls.md.
package tls
