package subscriber

import (
	"errors"

	"github.com/vramq/vramq/subscriber/queue"
)

// permanent reports whether err refuses what was sent for good, as the
// queue or the payload bucket that returned it classified it. Anything else
// (throttling, a 5xx, a timeout, access denied, which an operator may fix)
// may pass, and is retried later.
func permanent(err error) bool { return errors.Is(err, queue.ErrRefused) }

// refusalCode names a permanent refusal in a reason: its service's code,
// never its message, which may quote what was refused.
func refusalCode(err error) string {
	var qe *queue.Error
	if errors.As(err, &qe) && qe.Code != "" {
		return qe.Code
	}
	return "refused"
}
