module github.com/gymtrace/gymtrace/test/pbspython

go 1.26.8

require github.com/kluctl/go-embed-python v0.0.0-3.14.6-20260610-1

require (
	github.com/gofrs/flock v0.13.0 // indirect
	github.com/sirupsen/logrus v1.9.4 // indirect
	golang.org/x/sync v0.21.0 // indirect
	golang.org/x/sys v0.46.0 // indirect
)
