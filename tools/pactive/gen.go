package main

//go:generate go tool bpf2go -tags linux -target amd64 -type pa_rec pactive ../../bpf/pactive.c -- -I../../bpf -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror
