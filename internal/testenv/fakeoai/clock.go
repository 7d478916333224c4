package fakeoai

import "time"

// clock is the server's time: it starts at the real (or synctest) time of
// New and runs speed times as fast.
type clock struct {
	start time.Time
	speed float64
}

func (c clock) now() time.Time {
	return c.start.Add(time.Duration(float64(time.Since(c.start)) * c.speed))
}

// real converts a server duration to the real one a client waits.
func (c clock) real(d time.Duration) time.Duration {
	return time.Duration(float64(d) / c.speed)
}

// sleep waits d of server time; it reports false if quit closed first.
func (c clock) sleep(d time.Duration, quit <-chan struct{}) bool {
	if d <= 0 {
		select {
		case <-quit:
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(c.real(d))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-quit:
		return false
	}
}

// wireDuration formats d as OpenAI's reset headers do ("12ms", "6m0s"),
// rounded up to the millisecond so that a client never comes back early.
func wireDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return ceilTo(d, time.Millisecond).String()
}

func ceilTo(d, unit time.Duration) time.Duration { return (d + unit - 1) / unit * unit }
