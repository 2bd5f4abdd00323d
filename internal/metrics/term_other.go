//go:build !linux

package metrics

func isTerminalFd(uintptr) bool { return false }

func termWidth(uintptr) int { return 0 }
