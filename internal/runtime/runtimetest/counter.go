package runtimetest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// CounterScript is a Python program that keeps a counter in its memory and
// a random token drawn at start. Each SIGUSR1 adds one and writes
// "token count" to CounterFile. Run as a sandbox's init it proves that
// memory survives a checkpoint: after a restore the same token continues
// counting from where it was; a process started afresh has a new token and
// starts again at 1.
const CounterScript = `
import os, signal
n = 0
token = os.urandom(8).hex()
def bump(*_):
    global n
    n += 1
    with open('/var/tmp/counter.tmp', 'w') as f:
        f.write('%s %d\n' % (token, n))
    os.rename('/var/tmp/counter.tmp', '/var/tmp/counter')
signal.signal(signal.SIGUSR1, bump)
bump()
while True:
    signal.pause()
`

// CounterFile is where CounterScript writes its state.
const CounterFile = "/var/tmp/counter"

// CounterArgs is the start command running CounterScript.
var CounterArgs = []string{"/usr/bin/python3", "-c", CounterScript}

// Execer runs a command in one sandbox and returns its standard output and
// exit code.
type Execer func(ctx context.Context, args ...string) (string, int, error)

// Counter is the state CounterScript reports.
type Counter struct {
	Token string
	N     int
}

// ReadCounter reads the counter's state, waiting for the program to have
// written it once.
func ReadCounter(ctx context.Context, ex Execer) (Counter, error) {
	var last error
	for ctx.Err() == nil {
		out, code, err := ex(ctx, "cat", CounterFile)
		if err != nil {
			return Counter{}, err
		}
		if code == 0 {
			f := strings.Fields(out)
			if len(f) == 2 {
				n, err := strconv.Atoi(f[1])
				if err == nil {
					return Counter{Token: f[0], N: n}, nil
				}
			}
			last = fmt.Errorf("counter file holds %q", out)
		} else {
			last = fmt.Errorf("cat %s exited %d", CounterFile, code)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return Counter{}, fmt.Errorf("read counter: %v (last: %v)", ctx.Err(), last)
}

// Bump signals the counter (init, PID 1) and waits until it has counted.
func Bump(ctx context.Context, ex Execer) (Counter, error) {
	before, err := ReadCounter(ctx, ex)
	if err != nil {
		return Counter{}, err
	}
	if _, code, err := ex(ctx, "kill", "-USR1", "1"); err != nil || code != 0 {
		return Counter{}, fmt.Errorf("kill -USR1 1: exit %d, %v", code, err)
	}
	for ctx.Err() == nil {
		c, err := ReadCounter(ctx, ex)
		if err != nil {
			return Counter{}, err
		}
		if c.N != before.N || c.Token != before.Token {
			return c, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return Counter{}, fmt.Errorf("counter did not move from %d: %v", before.N, ctx.Err())
}
