// Package kversion reads the running kernel's version, for the few choices
// that a feature probe cannot make (a behaviour fixed in a given release,
// not a feature that is there or not).
package kversion

import (
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Running returns the running kernel's major and minor version; ok is false
// when uname fails or its release does not read as a version.
func Running() (major, minor int, ok bool) {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return 0, 0, false
	}
	return Parse(unix.ByteSliceToString(u.Release[:]))
}

// AtLeast reports whether the running kernel is major.minor or newer; false
// when its version cannot be read.
func AtLeast(major, minor int) bool {
	ma, mi, ok := Running()
	return ok && (ma > major || ma == major && mi >= minor)
}

// Parse reads a kernel release such as "6.18.44-..." or "6.4-rc1" as 6, 18
// or 6, 4.
func Parse(release string) (major, minor int, ok bool) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	digits := parts[1]
	if i := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		digits = digits[:i] // "4-rc1"
	}
	minor, err2 := strconv.Atoi(digits)
	return major, minor, err1 == nil && err2 == nil
}
