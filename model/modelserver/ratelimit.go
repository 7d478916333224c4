package modelserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramq/vramq/job/fault"
)

// Rate limits: tokens and requests per minute. Providers count them
// differently (OpenAI and Anthropic a bucket refilled continuously, LiteLLM
// and most gateways a fixed or sliding minute, Azure OpenAI a minute for
// tokens and windows of 1 s or 10 s for requests), and the headers do not
// say which; what holds for every kind is that no limiter over a minute
// holds more of one process's use than it sent in the minute. There are
// two kinds of bucket, and a request waits until every one has room:
//
//   - own buckets, for the limits configured here (Config.TPM, RPM),
//     refilled continuously: a request takes its reservation (prompt
//     estimate + max output × n) before it is sent, and gets back what its
//     usage shows it did not use;
//   - mirrors of the server's limits, made from the first answer that
//     carries x-ratelimit-limit-* (or, as Azure's, a remaining count
//     alone: its limit inferred), and set to the server's remaining count
//     at every answer after (bucket.proven). Several subscribers on one
//     endpoint see each other only there, so they converge through the
//     server's headers alone. A mirror is not refunded: the next answer's
//     remaining count says what the server charged.
//
// Between answers a mirror counts room in one of two ways. Alone on its
// limit (no evidence of others: bucket.lone), it counts the limit less all
// it sent within the minute (bucket.floor), each send at what the server
// charged once answered, bounded by the room the last answer proved: it
// never has more than the limit in any minute, which no kind refuses, and
// it takes a sliding window's lumps as they come back. With others on it,
// it refills at the rate the others leave (their consumption is what the
// server counts as taken beyond all this process sent within the minute,
// bucket.estimate), no further than the last answer proved while another
// answer is on its way, and keeps a margin unspent: marginK times the
// typical request's cost, which a 429 from the limiter raises and a run of
// clean answers lowers back; paced (below), pacedMargin typical requests,
// the same for every process. Three subscribers that each saw the whole
// refill would wake together at every refill and collide; each seeing its
// share, they pace.
// Each also paces its own sends at a rate of its own, found by AIMD on
// the counts the answers show (rates.congestion), so that the room the
// mirrors follow is seldom what divides the limit.
//
// Requests are spread besides: at most a second's share of the RPM in any
// second (perSecond), as Azure evaluates them.
//
// An answer's remaining count cannot include what this process sent while
// the answer was on its way back: the requests sent in the last transit
// are taken off it again, as the server may not have seen them yet, all
// but the answered request itself, which it has (at worst a transit's
// worth of this process's other requests is counted twice).
//
// golang.org/x/time/rate does not fit: its Limiter has no way to give
// tokens back or to set the tokens left to what a server says.
const (
	marginMin      = 1.0
	marginMax      = 32.0
	marginRaise    = 1.5
	marginDecay    = 0.9
	marginCleanRun = 200 // answers before the margin decays a step
	transit        = 100 * time.Millisecond
)

const (
	kindTokens = iota
	kindRequests
)

var kindNames = [2]string{"tokens", "requests"}

type bucket struct {
	mirror   bool
	perSec   float64
	capacity float64
	level    float64
	last     time.Time

	// A mirror's estimate of the other subscribers' consumption, last
	// updated at estAt, from this process's own sends of the last minute.
	othersPerSec float64
	estAt        time.Time
	own          []sent // oldest first; tokens is the cost in the bucket's kind
	// proven is a mirror's room the server's last answer showed: its
	// remaining count, less what this process sent since.
	proven float64
	// freed is what of own has left the server's count and is not yet
	// taken by released.
	freed float64

	// readings are the refill rates the headers implied within the
	// limit's span (rateReading), for a mirror whose server sends resets.
	readings []sent
	// inferred is a mirror of a limit the headers do not give (Azure's):
	// its capacity is the most it has been shown to hold.
	inferred bool
	// sharedAt is when the estimate last showed others on the limit.
	sharedAt time.Time
	// A fixed minute's end, as answers show it (windowEnd), from the
	// last answer's end and remaining count (lastEnd, lastRemaining).
	windowEnd, lastEnd, lastAt time.Time
	lastArrived                time.Time
	lastRemaining              float64
	// endFromStart is whether windowEnd was read from a minute's start
	// (the remaining count jumping back up), not from two resets;
	// jumpedAt is when the count last jumped back up so.
	endFromStart bool
	jumpedAt     time.Time
	// roseAt is when an answer's count last rose over the one before it
	// (lastRemaining), dated by its arrival (sameMinute).
	roseAt time.Time
	// slidingAt is when an answer last showed a sliding window, slideEnd
	// the end of the last answer's reset, dated by its arrival
	// (observeSliding).
	slidingAt, slideEnd time.Time
}

// windowLeft is the time left of a fixed minute, as the answers showed
// its end (observeWindow); ok is false where none did within sharedHold.
func (b *bucket) windowLeft(now time.Time) (time.Duration, bool) {
	if b.windowEnd.IsZero() || now.Sub(b.windowEnd) > sharedHold {
		return 0, false
	}
	if b.endFromStart && !now.Before(b.windowEnd) {
		// A minute read from its start ends when an answer shows the
		// next one's start, not before: reckoned to have started again
		// at its estimated end, a process read the rest of the old
		// minute as a new one nearly spent, cut its pace and held it to
		// a share of that rest (windowShare): the three sharing Azure's
		// limit in real time had a minute at 0.65–0.76 of it in four
		// runs of five, and admitted 0.942 and 0.959 of it over 7
		// minutes in two, against 0.963 and 0.967 so
		// (bench/modelserver.md, "Azure's minute past its estimated
		// end").
		return 0, true
	}
	left := b.windowEnd.Sub(now) % limitSpan
	if left <= 0 {
		left += limitSpan
	}
	return left, true
}

// sameEnd is how close two answers' window ends must be to be one: the
// fake and OpenAI write resets to the millisecond; a request's transit
// varies by a few.
const sameEnd = 25 * time.Millisecond

// windowFresh is how near the whole span a reset may be and still show a
// fixed minute's end (observeWindow): such a minute is then in its first
// seconds.
const windowFresh = 5 * time.Second

// observeWindow reads a fixed minute's end from an answer: its remaining
// count and, where the server sends one, its reset, of the request sent at
// now, whose answer arrived at arrived. A fixed minute's reset ends at the
// same instant whatever was charged between two answers; a bucket's and a
// sliding window's move with each charge, but two requests sent at one
// instant may show one end: the answers compared are a second apart or
// more. The end is dated by the answer's arrival: a server writes the
// reset as it answers (the fake, and OpenAI's non-streamed answers, whose
// headers come with the body), and dated by the send, two answers of a
// sliding window whose generations differed by their sends' distance
// showed one end (about once in two runs of TestBenchShare's, each such
// process then held out of its part of the window for two minutes: one of
// three 20–40% off the mean). A sliding window's reset is its newest
// charge's, nearly the whole span while requests come: a reset within
// windowFresh of the span is no fixed minute's evidence (two answers a
// second apart still showed one end, about once in ten runs, a charge
// admitted just after the first).
// Without a reset (Azure's), a minute's start shows as its remaining
// count jumping back up by more than a quarter of the limit. Any rise of
// the count is kept too, dated by the answer's arrival (roseAt:
// sameMinute).
func (b *bucket) observeWindow(remaining float64, reset time.Duration, hasReset bool, now, arrived time.Time) {
	if hasReset {
		end := arrived.Add(reset)
		apart := arrived.Sub(b.lastArrived).Abs() >= time.Second
		b.lastArrived = arrived
		if d := end.Sub(b.lastEnd); apart && reset > 0 && reset < limitSpan-windowFresh && d < sameEnd && d > -sameEnd && remaining < b.lastRemaining {
			b.windowEnd, b.endFromStart = end, false
		}
		b.lastEnd = end
	}
	if !b.lastAt.IsZero() && remaining > b.lastRemaining {
		b.roseAt = arrived
	}
	jumped := !b.lastAt.IsZero() && remaining > b.lastRemaining+b.capacity/4
	if jumped {
		b.jumpedAt = now
	}
	if !hasReset && jumped {
		// The minute started after the last answer: taken as started
		// then, a process that hears seldom (one sending less) reckons
		// its minute shorter and its slack larger, and is cut less
		// (taken at the middle of the two answers' sends, or narrowed by
		// the starts before, one of three sharing was over 20% off the
		// mean in 11 and 17 runs of 100 of TestBenchShare's 32-item
		// batches, against 0 to 4). Its end is then early by up to the
		// time between the answers (windowLeft).
		b.windowEnd, b.endFromStart = b.lastAt.Add(limitSpan), true
	}
	b.lastRemaining, b.lastAt = remaining, now
}

// sameMinute is whether an answer whose count is remaining, of a request
// reserved at sentAt, shows the count that request was charged to: the
// count has not risen since it was sent (a window restarting, or a bucket
// refilling, which this cannot tell apart; observeWindow keeps the last
// count and when one rose). The first answer proves nothing: it has none
// to rise over. Asked before observeWindow reads the answer.
func (b *bucket) sameMinute(remaining float64, sentAt time.Time) bool {
	return !sentAt.IsZero() && !b.lastAt.IsZero() && remaining <= b.lastRemaining && b.roseAt.Before(sentAt)
}

// sliding is whether the answers showed a sliding window within
// sharedHold (slidingAt) and no fixed minute: only there does a send of
// this process leaving the count give back its room (replayable). A bucket
// gives back room at its refill, whoever sent, and a fixed minute all at
// its start.
func (b *bucket) sliding(now time.Time) bool {
	if _, fixed := b.windowLeft(now); fixed {
		return false
	}
	return !b.slidingAt.IsZero() && now.Sub(b.slidingAt) < sharedHold
}

// observeSliding reads a sliding window from an answer's remaining count
// and reset, received at now: a bucket refilled at the limit a minute is
// whole again in (limit − remaining) / limit of a minute, which is what
// OpenAI's reset says; a sliding window's reset is until its newest
// charge leaves it (internal/testenv/fakeoai, sliding.reset), nearly the
// whole span while requests come, however much remains. A reset longer
// than a bucket's by slidingSlack or more, whose end moved a second or
// more later since the last answer's, is a window's: a fixed minute's end
// stays where it is within a minute (the headers are written as the
// answer is, so dated by its arrival, not by its send, whose generation
// varies), and jumps by a minute at the next.
func (b *bucket) observeSliding(remaining float64, reset time.Duration, now time.Time) {
	end := now.Add(reset)
	moved := end.Sub(b.slideEnd)
	bucketReset := limitSpan.Seconds() * (1 - math.Min(remaining, b.capacity)/b.capacity)
	if !b.slideEnd.IsZero() && moved >= time.Second && moved < limitSpan/2 && reset.Seconds() >= bucketReset+slidingSlack.Seconds() {
		b.slidingAt = now
	}
	b.slideEnd = end
}

const slidingSlack = time.Second

// shared is whether others were seen on the limit within sharedHold: the
// evidence of a fixed minute's comes only late in each minute, when its
// count has passed all this process sent in the last one, and is gone
// again once the minute restarts, where the others are not.
func (b *bucket) shared(now time.Time) bool {
	return !b.sharedAt.IsZero() && now.Sub(b.sharedAt) < sharedHold
}

const sharedHold = 2 * limitSpan

// A lone mirror (othersPerSec at most loneShare of its refill) counts its
// room from this process's own sends: no limiter over a minute (a bucket
// refilled at the limit a minute, a sliding or a fixed minute's window)
// holds more of one process's use than it sent in the minute, so the
// limit less all it sent within the span remains: its floor, exact for a
// sliding window, the least a bucket or a fixed minute holds. Paced by
// its floor, a lone process never sends more than the limit in any
// minute, which no kind refuses: a sliding window's lumps are taken as
// they come back, a fixed minute's return is not all taken at its start
// (LiteLLM counts usage as answers come, and admitted the requests in
// flight past its limit, then refused the minute's last), and Azure's
// strict minute is never overrun. Each send counts what the server
// charges once its answer says (charged), until then its reservation.
const loneShare = 0.02

func (b *bucket) lone() bool { return b.othersPerSec <= loneShare*b.perSec }

// span is the limit's span as its refill shows it: a minute, or less for
// a server whose minutes run faster (a test server's). The refill is the
// least read in a minute (rateReading), which a window's boundary does not
// inflate; the estimate of others' use keeps the fixed minute (limitSpan).
func (b *bucket) span() time.Duration {
	if b.perSec <= 0 {
		return limitSpan
	}
	return min(limitSpan, seconds(b.capacity/b.perSec))
}

// floor is the limit less this process's sends within the span (the
// server sees them a transit later, and lets them go a transit later).
func (b *bucket) floor(now time.Time) float64 {
	return b.capacity - b.ownWithin(now, b.span())
}

// floorWait is how long until the floor holds need: until enough of this
// process's sends have left the span; the span when none would do.
func (b *bucket) floorWait(need float64, now time.Time) time.Duration {
	allowed := b.capacity - need
	if allowed < 0 {
		return b.span()
	}
	span := b.span()
	sum := b.ownWithin(now, span)
	from := now.Add(-(span + transit))
	for _, s := range b.own {
		if sum <= allowed {
			break
		}
		if !s.at.After(from) {
			continue
		}
		sum -= s.tokens
		if sum <= allowed {
			return s.at.Add(span + transit).Sub(now)
		}
	}
	return 0
}

// answered records that the send reserved at sentAt reached the server
// by seen, as its answer shows. Of sends reserved at one instant, the
// first not yet answered is taken: they are one to the limit.
func (b *bucket) answered(sentAt, seen time.Time) {
	for i := range b.own {
		if s := &b.own[i]; s.at.Equal(sentAt) && s.seen.IsZero() {
			s.seen = seen
			return
		}
	}
}

// othersShare bounds the estimate of the others' consumption, so that a
// mirror always refills a little and a request is never starved.
const othersShare = 0.95

func newBucket(perMinute float64, now time.Time, mirror bool) *bucket {
	return &bucket{mirror: mirror, perSec: perMinute / 60, capacity: perMinute, level: perMinute, last: now}
}

// refill brings a bucket's level to now: an own bucket's and a shared
// mirror's at its refill (less the others' share), a lone mirror's to the
// least of its floor and the room its server's last answer proved. While
// capped (an answer on its way, whose remaining count will say more), a
// shared mirror refills no further than its proven room: a window gives
// back only what leaves it, in lumps, and a mirror that counted a
// continuous refill between answers sent the request that a window's end
// refused, about one a minute.
func (b *bucket) refill(now time.Time, capped bool) {
	dt := max(0, now.Sub(b.last))
	if b.mirror && b.lone() {
		if !capped {
			// With no answer on its way, the room proven is the last
			// one's, older by dt: refilled as a bucket would be, it lets
			// one request go to ask, where the server showed less than
			// the floor (others' use not yet estimated).
			b.proven = math.Min(b.capacity, b.proven+dt.Seconds()*b.perSec)
		}
		b.level, b.last = math.Min(b.proven, b.floor(now)), now
		return
	}
	if dt <= 0 {
		return
	}
	b.last = now
	next := math.Min(b.capacity, b.level+dt.Seconds()*(b.perSec-b.othersPerSec))
	if capped && b.mirror {
		next = math.Min(next, b.proven)
	}
	b.level = math.Max(b.level, next)
}

// limitSpan is the span of the limits vramq follows, per minute: whatever
// the limiter (a bucket refilled at the limit a minute, a sliding or fixed
// minute's window), what was taken longer ago than that has been given
// back. A fixed minute, not one read from the refill: near a window's
// boundary (limit − remaining) / reset reads as a refill many times the
// limit, a span of seconds, and all of this process's earlier sends as
// others' use (a stall of 4.5 minutes in the real-time benchmark). A test
// server whose minutes run faster than real ones is measured wrongly
// here, which is why the figures are taken in real time.
const limitSpan = time.Minute

// rateReading sets a mirror's refill from a rate its server's headers
// imply at now, (limit − remaining) / reset: the least such rate read
// within the limit's span, never below the limit a minute. For a bucket
// the reading is the same at every answer (the reset is the time to a
// full bucket); a window's reset is the time to its next minute or its
// oldest charge, and near a fixed minute's end it reads as many times the
// limit: a mirror refilled at that sent the next minute's limit at once
// and met 429s before the minute was out. The least reading of a minute
// holds for both, and a test server's faster clock still reads faster.
func (b *bucket) rateReading(perSec float64, now time.Time) {
	i := 0
	for i < len(b.readings) && now.Sub(b.readings[i].at) > limitSpan {
		i++
	}
	// Only the readings that may yet be the least are kept: each is below
	// every later one.
	j := len(b.readings)
	for j > i && b.readings[j-1].tokens >= perSec {
		j--
	}
	b.readings = append(b.readings[i:j], sent{at: now, tokens: perSec})
	b.perSec = math.Max(b.readings[0].tokens, b.capacity/limitSpan.Seconds())
}

// charge records this process's cost of a request sent at now, its
// reservation seq (mirrors).
func (b *bucket) charge(cost float64, now time.Time, seq uint64) {
	b.own = append(b.own, sent{at: now, tokens: cost, seq: seq})
}

// arrivalLag bounds how much later than its reservation a send may have
// reached the server, as far as the estimate of others' use counts it
// (ownHeld): a request's answer says the server saw it by then, but not
// when, and a long generation would have this process's sends counted
// long after the server let them go, hiding others' use.
const arrivalLag = 5 * time.Second

// ownHeld is what of this process's sends the server may still hold at
// now: each counted a span from the latest it may have reached the
// server, as its answer dates it (answered) or now if unanswered, at most
// arrivalLag after it was sent.
// Counted from its reservation instead, as the floor counts it, a send
// delivered late leaves this process's count before it leaves a sliding
// window's, and a lump of such sends read as others' use (in the real-time
// benchmark, a lone subscriber paced at a third of the limit for up to
// two minutes, TestLoneModelBatchesAgainstASlidingWindow).
func (b *bucket) ownHeld(now time.Time) float64 {
	b.prune(now)
	sum := 0.0
	for _, s := range b.own {
		if now.Before(s.heldUntil(now)) {
			sum += s.tokens
		}
	}
	return sum
}

// heldUntil is when a send of this process leaves the server's count
// (ownHeld), as known at now: a span and a transit from the latest it may
// have reached the server.
func (s *sent) heldUntil(now time.Time) time.Time {
	reached := now
	if !s.seen.IsZero() {
		reached = s.seen
	}
	late := min(max(0, reached.Sub(s.at)), arrivalLag)
	return s.at.Add(late + limitSpan + transit)
}

// prune drops the sends no count includes any longer; those not yet
// counted as released (released) are, as they have all left the count.
func (b *bucket) prune(now time.Time) {
	i := 0
	for i < len(b.own) && now.Sub(b.own[i].at) >= limitSpan+transit+arrivalLag {
		if !b.own[i].released {
			b.freed += b.own[i].tokens
		}
		i++
	}
	b.own = append(b.own[:0], b.own[i:]...)
}

// released is what of this process's sends has left the server's count
// (heldUntil) since the last call, and when the next one still counted
// leaves it (zero if none).
func (b *bucket) released(now time.Time) (tokens float64, next time.Time) {
	b.prune(now)
	for i := range b.own {
		s := &b.own[i]
		if !next.IsZero() && !s.at.Add(limitSpan+transit).Before(next) {
			// The sends are in the order they were taken, and none
			// leaves before a span and a transit after it was: neither
			// this one nor any after it leaves before next.
			break
		}
		if s.released {
			continue
		}
		if at := s.heldUntil(now); now.Before(at) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		s.released = true
		b.freed += s.tokens
	}
	tokens, b.freed = b.freed, 0
	return tokens, next
}

// ownCounted is what of this process's sends the server counts at now
// in a fixed minute whose end two resets showed (observeWindow): those
// counted since the minute started, by usage the answered ones (and the
// one being answered, sent at answering, at its reservation, as its usage
// is not read yet), at arrival those sent since; ok is false elsewhere,
// where what it may still hold (ownHeld) is its count. Not in a minute
// whose start was read from the count jumping back up (Azure's): that
// start is known only to within the answers around it, and a lone
// process counting its own use from it saw others where there were none
// (a third of the limit used in TestOneModelAgainstEachWindowLargeRequests).
func (b *bucket) ownCounted(now time.Time, byUsage bool, answering time.Time) (float64, bool) {
	left, ok := b.windowLeft(now)
	if !ok || b.endFromStart {
		return 0, false
	}
	start := now.Add(left - limitSpan)
	sum := 0.0
	for _, s := range b.own {
		switch {
		case !byUsage:
			if s.at.After(start.Add(-transit)) {
				sum += s.tokens
			}
		case !s.readAt.IsZero():
			if s.readAt.After(start) {
				sum += s.tokens
			}
		case s.at.Equal(answering):
			sum += s.tokens
		}
	}
	return sum, true
}

// ownWithin is what this process sent within span (and a transit) of now.
func (b *bucket) ownWithin(now time.Time, span time.Duration) float64 {
	b.prune(now)
	sum := 0.0
	// Newest first: the sends are in the order they were taken.
	from := now.Add(-(span + transit))
	for i := len(b.own) - 1; i >= 0 && b.own[i].at.After(from); i-- {
		sum += b.own[i].tokens
	}
	return sum
}

// estimate updates a mirror's estimate of the others' consumption from the
// server's count, level, at now, on evidence only: what the server counts
// as taken from the limit (capacity less level) beyond all of this
// process's sends it may still hold (ownHeld). No limiter over a minute holds
// more of one process's use than it sent in that minute (a bucket refilled
// at the limit a minute holds less; a window, exactly that), so a larger
// deficit is others' doing, spread over the span; a smaller one says
// nothing of them. The refill the mirror expected and did not see is no evidence: a
// window gives back only what leaves it, in lumps, and a lone subscriber
// that read its own past as others' use waited up to 20 times too long
// (bench/modelserver.md, "Against each limiter kind"). Three subscribers
// that hold a limit full each see the other two's share. The estimate
// follows the evidence with some inertia, and decays as it ages out of
// the minute.
// In a fixed minute whose end the answers show, this process's use is
// what the server counts of it since the minute started (ownCounted), not
// all it sent within the span: a process that sent the whole limit in
// each minute saw no one else, as no count passed its own last minute,
// sent as alone, and took nearly every minute's room (in about one run in
// 30 of TestBenchShare's 32-item batches against LiteLLM's minute, 908
// items against 67 and 60, with 5.6% 429s). byUsage is whether the server
// counts usage (chargeBasis), answering the send whose answer gave level.
func (b *bucket) estimate(level float64, now time.Time, byUsage bool, answering time.Time) {
	switch {
	case b.estAt.IsZero():
		// The first reading: this process has no minute of its own sends
		// to weigh the deficit against yet.
		b.estAt = now
		return
	case now.Sub(b.estAt) < time.Second:
		return
	}
	own := b.ownHeld(now)
	if counted, ok := b.ownCounted(now, byUsage, answering); ok {
		own = math.Min(own, counted)
	}
	others := math.Max(0, b.capacity-level-own) / limitSpan.Seconds()
	b.othersPerSec = math.Min(othersShare*b.perSec, 0.7*b.othersPerSec+0.3*others)
	b.estAt = now
	if !b.lone() {
		b.sharedAt = now
	}
}

// Sharing a limit (a mirror with evidence of others within sharedHold:
// bucket.shared), each process paces its own sends at a rate of its own,
// r.pace, found by AIMD. The server's room a mirror follows cannot divide
// the limit: three processes read the same remaining count and each sent
// into it (1.9–3.4% 429s in the real-time benchmark), and whoever asked
// first took the most (65, 118 and 415 items against one bucket). Paced
// below the limit together, they leave room in it, and the mirror's proven
// room binds none of them.
//
//   - The pace grows by paceIncrease of the limit a second, only while a
//     request waits for it (rates.hold: the pace is its longest wait; a
//     request it handed back waits too, until its backoff ends). A
//     pace the process does not use (no work, or held by the mirror) is
//     no evidence of room, and grown so, three paces summed to 1.3–1.5
//     times the limit, which the mirrors then divided first come, first
//     served (RFC 7661's argument for a congestion window); grown while
//     its room was under a burst's, which it is after every send, a
//     process sending one request in 5 s grew until a cut (in
//     TestOfferSharesTheServersLimits it offered up to 3,200 tokens for
//     30 s in which it used about 800).
//     With half the limit unused, it grows by half at a time, if a
//     request waited for it within cutEvery, but not within a minute of
//     the room jumping back up: it did so at every fixed minute's start,
//     and the paces met its end with 429s (most of minute 1's in
//     TestThreeModelsShareEachLimiterKind).
//   - While no request waits at all and its room is full, the process is
//     limited by its work, not by the limit (RFC 7661's
//     "application-limited"), and the pace decays towards paceUnused times
//     what it sent over paceUsedOver (as charged), over paceUsedOver: a
//     pace grown while the requests cost more, or the work was more, is
//     no longer shown to be this process's. Not while requests wait on
//     the mirror, or wait out a backoff (rates.heldBack): a process the
//     others' use holds sends little, and decayed to its use it stayed
//     held (one of three sharing a sliding window 23% and 24% under the
//     mean in 2 runs of 20 of TestThreeModelsShareEachLimiterKind; growth
//     only while 0.8 of the pace was used over 30 s, tried before, missed
//     ±20% in 2 of 20).
//   - It is cut when an answer shows the limit congested: its room under
//     two typical requests or paceFull of the limit, or, for a fixed
//     minute whose end the answers show (observeWindow), less room than
//     the limit's rate lasts to that end. The cut takes paceCut times this
//     process's share of the draw (its pace over its pace and the others'
//     estimated use), so that the larger share gives up more; all reading
//     the same counts are cut together, and equal increases after
//     proportional cuts bring their rates together (Chiu and Jain's
//     argument for AIMD). At most one cut in cutEvery, and none while the
//     room recovers from the last one.
//   - In a fixed minute whose start the answers show, it is held to this
//     process's share of what remains over what remains of the minute
//     (windowShare): "remaining over time to reset, scaled by one's share
//     of the observed draw". Cut only when the room was short, paces
//     summed over the limit spent each strict minute before its end, and
//     the requests sent into its last room met 429s.
//   - In a sliding window (bucket.sliding), the pace is a window, not a
//     rate: TCP's congestion window clocked by its acknowledgements
//     (Jacobson, "Congestion Avoidance and Control", 1988), where a
//     charge leaving the count is the acknowledgement. A send, new or
//     again, goes only while this process's own sends within the span
//     and the send fit within what the pace passes in a span (inWindow).
//     What it holds it keeps by sending again as much as its own sends
//     leave the window, as they leave it (rates.replayable), whatever the
//     mirror's margin says: each process knows its own sends' charges and
//     when they leave exactly (heldUntil), and no other's, so none sends
//     into another's returning room, and the margin guards only the room
//     no one holds. A new send goes only into room an answer proved,
//     less its own sends since (take's provenOnly): a mirror refilled
//     between answers at the rate the others leave counted their
//     returning room as free, and nearly every 429 of three sharing was
//     a send into it. The margin is slidingMargin typical requests.
//     The window grows, as the rate does elsewhere, only while it alone
//     holds a request back; a congestion cut takes slidingCut of its
//     share, and what the process's sends free past the cut window is
//     not sent again: the larger part gives up more (Chiu and Jain). A
//     429 cuts it to slidingCut429 only: it falls on whichever send met
//     another's in the same room, not on the larger part.
//     It grows faster the smaller its part (rates.increase): a process
//     grows only while its window alone holds it, which is while an
//     answer has shown room, and the larger part, with more answers on
//     their way, hears of room more often and grew more often; with
//     equal increases the parts a first minute left 3 to 1 apart were
//     still 20% off the mean at minute 10 in 20 and 24 of 100 runs of
//     TestBenchShare's 32-item batches, against 3 of 100 with the
//     increase scaled and the cut at 0.35 (bench/modelserver.md,
//     "Growth by the others' part").
//     As a rate, the pace let a process send new requests into room the
//     others' sends freed as fast as it heard of it, whatever its part;
//     a cut owed part of its part instead, and the window stayed 0.93
//     full (median of 40 runs of TestBenchShare's 32-item batches; one
//     of three over 20% off the mean in 1 to 4 of 40). As a window, 0.95
//     to 0.96 full, 1 to 3 of 40 (bench/modelserver.md, "The pace as a
//     window"). Grown also while the server's room holds a request, the
//     windows summed past the limit, whoever heard of room first took
//     it, and 20 to 27 runs of 40 were over 20%.
//   - Against a bucket, it is cut by paceCutBound times its share of the
//     draw, at most once in cutEvery, when a request waits for the
//     mirror's room rather than for the pace (mirrorBound): the paces
//     then sum to more than the limit, and the mirror, which is first come
//     first served, divides it, not the paces. Cut only at the congestion
//     above (room under two typical requests), paces summed to 1.3–1.7
//     times the limit for minutes, each process's requests waited on its
//     mirror, and whoever saw room first took it: one of three 24–47% off
//     the mean in 8 runs of 10 of TestBenchShare's single items run as the
//     subscriber runs its messages (a batch handed back runs again with
//     what it had not finished). Cut by 0.1, the increases outran the cuts
//     (0.4% of the limit a second for each process against about 3% of
//     it in 5 s), and 1 run of 10 was 28% off; by 0.25, within 11% in
//     each of 40 runs (bench/modelserver.md). Not in a sliding window, whose
//     parts are kept by sending again, nor in a fixed minute whose end
//     the answers show (its room comes back all at once, and each process
//     waits for it).
//   - A 429 cuts it to paceCut429, the penalty the increases then decay.
//   - It starts at a third of the limit at most (what the estimate of
//     others leaves, which lags them), with its room at a random point in
//     a typical request's cost, so that processes do not send in step.
const (
	paceIncrease = 0.004
	paceCut      = 0.45
	paceCut429   = 0.6
	paceCutBound = 0.25
	paceFull     = 0.05
	paceLeast    = 0.02 // of the limit: a share is never starved
	paceBurst    = 2 * time.Second
	cutEvery     = 5 * time.Second
	recoverFor   = 20 * time.Second
	growAfter    = limitSpan
	pacedMargin  = 3.0
	paceUnused   = 1.5
	paceUsedOver = 30 * time.Second
	replayKept   = 2.0
	replayNeed   = 0.5
	// In a sliding window ("Sharing a limit", paceRulesOf): pacedMargin,
	// paceCut, paceCut429 and paceIncrease there; slidingSpread bounds
	// how far the increase is scaled by the parts (rates.increase).
	slidingMargin   = 1.25
	slidingCut      = 0.35
	slidingCut429   = 0.85
	slidingIncrease = 3 * paceIncrease
	slidingSpread   = 6.0
)

// paceRules are the shared pace's factors that depend on the limit's kind
// ("Sharing a limit"): the share of its part a congestion cut takes, what
// a 429 cuts it to, and the margin of room, in typical requests, a new
// send leaves.
type paceRules struct{ cut, cut429, margin float64 }

// paceRulesOf is the pace's rules against b as the answers show it at
// now. In a sliding window the pace is a window (inWindow), and a cut
// one: what its sends free past it is not sent again, so a cut takes
// less; a 429 there falls on whichever send met another's in the same
// room, not on the larger part; and its room is proven (provenOnly),
// not refilled, so the margin is smaller. b may be nil.
func paceRulesOf(b *bucket, now time.Time) paceRules {
	if b != nil && b.sliding(now) {
		return paceRules{slidingCut, slidingCut429, slidingMargin}
	}
	return paceRules{paceCut, paceCut429, pacedMargin}
}

func (r *rates) minPace() float64 { return paceLeast * r.srv[kindTokens].perSec }

// advancePace brings the pace and its room to now. r.mu is held, and a
// pace is set.
func (r *rates) advancePace(now time.Time) {
	b := r.srv[kindTokens]
	dt := max(0, now.Sub(r.paceAt)).Seconds()
	full := math.Max(r.typical, r.pace*paceBurst.Seconds())
	r.paceLevel = math.Min(r.paceLevel+r.pace*dt, full)
	switch {
	case r.paceHeld > 0 || r.paceAt.Before(r.paceBackUntil): // the pace binds ("Sharing a limit")
		r.pace = math.Min(b.perSec, r.pace+r.increase(b, now)*b.perSec*dt)
	case r.waiting == 0 && !r.paceAt.Before(r.backUntil) && r.paceLevel >= full: // limited by its work
		used := math.Max(r.minPace(), paceUnused*b.ownWithin(now, paceUsedOver)/paceUsedOver.Seconds())
		if r.pace > used {
			r.pace -= (r.pace - used) * math.Min(1, dt/paceUsedOver.Seconds())
		}
	}
	r.paceAt = now
}

// increase is how fast the pace grows while it binds, of the limit a
// second: paceIncrease; in a sliding window slidingIncrease, times the
// others' use over this process's pace, halved, within slidingSpread of
// 1 either way: one of three at a third of the limit grows at
// slidingIncrease, one at a tenth 4.5 times as fast, one at a half half
// as fast ("Sharing a limit"). r.mu is held.
func (r *rates) increase(b *bucket, now time.Time) float64 {
	if !b.sliding(now) || r.pace <= 0 {
		return paceIncrease
	}
	return slidingIncrease * math.Min(slidingSpread, math.Max(1/slidingSpread, b.othersPerSec/r.pace/2))
}

// hold counts n more requests waiting (n < 0: done waiting), onPace
// whether the pace is what holds them, the pace brought to now first: it
// grows only over the time one waits for it, and decays only while none
// waits at all (advancePace). r.mu is held.
func (r *rates) hold(n int, onPace bool, now time.Time) {
	if r.pace > 0 && r.srv[kindTokens] != nil {
		r.advancePace(now)
	}
	r.waiting += n
	if onPace {
		r.paceHeld += n
		r.heldAt = now
	}
}

// heldBack records a request handed back at now to wait until then (a
// backoff: its batch waits holding its messages, and runs again), onPace
// whether the pace is what it waits for: waiting all the same, though not
// in take. Counted as done waiting, a process whose pace handed its
// batches back decayed on its own backoffs, passed less, and handed back
// more. r.mu is held.
func (r *rates) heldBack(until time.Time, onPace bool, now time.Time) {
	if r.pace > 0 && r.srv[kindTokens] != nil {
		r.advancePace(now)
	}
	if until.After(r.backUntil) {
		r.backUntil = until
	}
	if onPace {
		if until.After(r.paceBackUntil) {
			r.paceBackUntil = until
		}
		r.heldAt = now
	}
}

// paceWait is how long the next send, of tokens, waits for the pace: 0
// alone on the limit (no pace) or with room. In a sliding window the pace
// is a window, not a rate (inWindow). r.mu is held.
func (r *rates) paceWait(tokens float64, now time.Time) time.Duration {
	b := r.srv[kindTokens]
	if b == nil || !b.shared(now) {
		r.pace = 0
		return 0
	}
	if r.pace == 0 {
		r.pace = math.Max(r.minPace(), math.Min(b.perSec-b.othersPerSec, b.perSec/3))
		r.paceLevel, r.paceAt = -rand.Float64()*r.typical, now
	}
	r.advancePace(now)
	if b.sliding(now) {
		if r.inWindow(b, tokens, now) {
			return 0
		}
		// Until its own sends leave the window or the pace grows: each
		// wakes the wait (take), which looks again.
		return answerRecheck
	}
	if r.paceLevel >= 0 {
		return 0
	}
	return seconds(-r.paceLevel / r.pace)
}

// inWindow is whether a send of tokens keeps this process's part of a
// sliding window's count, its own sends within the span (ownHeld), within
// what its pace passes in a span: TCP's congestion window, not its rate.
// A rate's level let a process send new requests into room the others'
// sends had freed, as fast as it heard of it, while its part was already
// what its pace holds. r.mu is held.
func (r *rates) inWindow(b *bucket, tokens float64, now time.Time) bool {
	return b.ownHeld(now)+tokens <= r.pace*limitSpan.Seconds()
}

// replayable is whether this process's own sends that left the shared
// limit's count (bucket.released) leave room for a send of tokens at now,
// and when the next one leaves it (zero if none, or not paced). Only in a
// sliding window (bucket.sliding), where such room is certain: a send
// admitted there a span ago leaves exactly its charge, and the others,
// sending into what they see beyond the margin, do not take it first
// while it is under the margin. The room is kept at most replayKept
// typical requests: room not sent into promptly is the others' to see
// and take. A send goes on half its cost in such room (replayNeed): room
// waiting for a whole request lay unspent in the window, and the others,
// seeing it, sent into it (a mean of 0.3–0.4% 429s against 0.5–0.7% with
// the whole cost, in 10 to 20 runs of TestThreeModelsShareEachLimiterKind,
// for a throughput of 0.955 against 0.96). Only within the pace's window
// (inWindow): a cut pace leaves the room its sends free to the others.
// r.mu is held.
func (r *rates) replayable(tokens float64, now time.Time) (bool, time.Time) {
	b := r.srv[kindTokens]
	if b == nil {
		return false, time.Time{}
	}
	got, next := b.released(now)
	if r.pace == 0 || !b.sliding(now) {
		r.replay = 0
		return false, time.Time{}
	}
	r.replay = math.Min(replayKept*r.typical, r.replay+got)
	if !r.inWindow(b, 0, now) {
		// A part past what its pace holds is not kept.
		return false, next
	}
	return r.replay >= replayNeed*tokens, next
}

// congestion cuts the pace when an answer's room, b's proven, shows the
// shared limit nearly spent. r.mu is held.
func (r *rates) congestion(b *bucket, now time.Time) {
	if r.pace == 0 || !b.shared(now) {
		return
	}
	// short is how far the room falls short of the least it should hold.
	short := math.Max(2*r.typical, paceFull*b.capacity) - b.proven
	slack := b.proven
	if left, ok := b.windowLeft(now); ok {
		// What remains of a fixed minute lasts to its end only at less
		// than the limit's rate: the processes together spent faster.
		slack -= b.perSec * left.Seconds()
		short = math.Max(short, -slack-2*r.typical)
		if b.endFromStart {
			r.windowShare(b, left, now)
		}
	}
	if slack >= b.capacity/2 && now.Sub(b.jumpedAt) >= limitSpan {
		// Half the limit unused: the pace is not what divides it, and
		// grows by half, once in cutEvery, towards what the others
		// leave, rather than by paceIncrease alone (a pace cut to the
		// least took minutes to come back). Not within a minute of the
		// room jumping back up: a fixed minute's start shows the whole
		// limit unused at every minute, and paces grown on it met the
		// minute's end with 429s. Only if a request waited for the pace
		// within cutEvery: what the others leave unused is no reason to
		// grow a pace this process does not use.
		r.advancePace(now)
		if now.Sub(r.cutAt) >= growAfter && now.Sub(r.grownAt) >= cutEvery && now.Sub(r.heldAt) < cutEvery {
			r.pace = math.Max(r.pace, math.Min(1.5*r.pace, b.perSec-b.othersPerSec))
			r.grownAt = now
		}
		return
	}
	// A cut shows in the room only as the sends it slowed would have
	// been charged: while the room recovers from the last cut, no other
	// (a bucket emptied by a burst refills slowly, and cut after cut had
	// left it a tenth unused).
	if short <= 0 || now.Sub(r.cutAt) < cutEvery || (short < r.cutShort && now.Sub(r.cutAt) < recoverFor) {
		return
	}
	r.advancePace(now)
	share := r.pace / (r.pace + b.othersPerSec)
	r.pace = math.Max(r.pace*(1-paceRulesOf(b, now).cut*share), r.minPace())
	r.cutAt, r.cutShort = now, short
}

// mirrorBound cuts the pace by paceCutBound times its share of the draw
// when a request waits for the shared mirror's room rather than for the
// pace: the paces together ask more than the limit passes, and the mirror,
// first come first served, divides it. At most once in cutEvery. Not in
// a sliding window, whose parts are kept by sending again (replayable),
// nor in a fixed minute whose end the answers show ("Sharing a limit").
// r.mu is held.
func (r *rates) mirrorBound(now time.Time) {
	b := r.srv[kindTokens]
	if r.pace == 0 || b == nil || !b.shared(now) || b.sliding(now) || now.Sub(r.boundAt) < cutEvery {
		return
	}
	if _, fixed := b.windowLeft(now); fixed {
		return
	}
	r.advancePace(now)
	share := r.pace / (r.pace + b.othersPerSec)
	r.pace = math.Max(r.pace*(1-paceCutBound*share), r.minPace())
	r.boundAt = now
}

// windowShare holds the pace, in a fixed minute whose start the answers
// showed (Azure's: bucket.endFromStart), to this process's share of what remains of it over what remains
// of the minute: its share is what it sent of all the minute's count so
// far. Not in the minute's first windowSettle, when the shares are a few
// requests each, nor in its last half of that, when the rest is; and a
// pace is at most halved at once, so that the end of one minute does not
// leave the next at the least pace.
//
// Not where the end was read from two resets: a sliding window's reset is
// its oldest charge's, which two answers a few seconds apart may share
// (read as a fixed minute in about one run of two of the sliding window
// in TestThreeModelsShareEachLimiterKind, and a pace held to a minute's
// rest it did not have starved one of three), and LiteLLM's resets, read
// at the answer, agree only by chance. r.mu is held.
func (r *rates) windowShare(b *bucket, left time.Duration, now time.Time) {
	elapsed := limitSpan - left
	used := b.capacity - b.proven
	if elapsed < windowSettle || left < windowSettle/2 || used <= 0 {
		return
	}
	share := math.Min(1, b.ownWithin(now, elapsed)/used)
	target := share * math.Max(0, b.proven) / left.Seconds()
	if target >= r.pace {
		return
	}
	r.advancePace(now)
	r.pace = math.Max(math.Max(target, r.pace/2), r.minPace())
}

const windowSettle = 10 * time.Second

// tooLargeError is a request whose reservation exceeds a bucket's capacity:
// no wait would let it through.
type tooLargeError struct {
	kind           string
	cost, capacity float64
}

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("the request's %.0f %s exceed the rate limit's %.0f per minute", e.cost, e.kind, e.capacity)
}

type rates struct {
	mu sync.Mutex
	// sends are this process's requests of the last paceSpan, oldest
	// first (perSecond).
	sends       []time.Time
	paused      *prometheus.HistogramVec
	loggedUntil time.Time // the end of the last pause logged

	own     [2]*bucket
	srv     [2]*bucket
	marginK float64
	typical float64 // tokens of a typical request (a moving average)
	clean   int
	recent  []sent // the requests sent in the last transit, oldest first
	changed chan struct{}
	// answered is whether the server has answered yet: until it has, its
	// limits are unknown (learnedWithin).
	answered bool
	// inflight is the requests that took a reservation and have not
	// settled it: answers on their way.
	inflight int
	seq      uint64 // of the last reservation
	// windowRequests is the most requests a window of unnamed length has
	// been shown to hold (perSecond).
	windowRequests float64
	// pace is this process's own rate on a shared tokens mirror, tokens
	// a second (0 while alone: paceWait); paceLevel its room, negative
	// while the last sends are not yet paid off, as of paceAt; cutAt the
	// last time it was cut (congestion), cutShort how short the room fell
	// at that cut; grownAt the last time it grew by half.
	pace, paceLevel float64
	paceAt, cutAt   time.Time
	boundAt         time.Time // the last mirrorBound cut
	cut429At        time.Time // the last 429's cut (limited)
	grownAt         time.Time
	cutShort        float64
	// replay is the room this process's own sends left as they left the
	// shared limit's count, not yet spent again (replayable).
	replay float64
	// waiting is the requests waiting now (hold), for any room;
	// paceHeld those of them whose longest wait is the pace's; heldAt
	// when one last began or ended such a wait. backUntil and
	// paceBackUntil are the latest ends of the waits handed back
	// (heldBack), for any room and for the pace's.
	waiting, paceHeld        int
	heldAt                   time.Time
	backUntil, paceBackUntil time.Time
	waits                    *waits
	log                      *slog.Logger
	basis                    chargeBasis
}

type sent struct {
	at     time.Time
	tokens float64
	seq    uint64    // the reservation's (mirrors' own sends)
	seen   time.Time // the latest it reached the server, by its answer (mirrors' own sends)
	// released is whether it was counted as gone from the server's count
	// (bucket.released).
	released bool
	// What its answer showed and cost, for what the server charges
	// (chargeBasis): when it was read and the remaining count it gave;
	// its prompt + max output and its usage, 0 until its body is read;
	// whether what its answer showed was weighed.
	readAt        time.Time
	remaining     float64
	arrival, used float64
	weighed       bool
}

func newRates(tpm, rpm int, now time.Time, w *waits) *rates {
	r := &rates{marginK: marginMin, changed: make(chan struct{}), waits: w, log: w.log,
		paused: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vramq_subscriber_model_server_rate_wait_seconds",
			Help: "Time a request waited before it was sent, for room under a rate limit this process keeps by its own " +
				"reckoning (each wait at most a minute), by the limit of its longest wait.",
			Buckets: []float64{0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60},
		}, []string{"limit"})}
	if tpm > 0 {
		r.own[kindTokens] = newBucket(float64(tpm), now, false)
	}
	if rpm > 0 {
		r.own[kindRequests] = newBucket(float64(rpm), now, false)
	}
	return r
}

// reservation is what one request took from the buckets.
type reservation struct {
	tokens float64
	at     time.Time // when it was taken: the request's entry in rates.recent
	seq    uint64    // which one: several may be taken at one instant
}

// Pauses this process imposes on itself, by its own reckoning of a limit
// (take), are bounded by the limit's span: every limit here is per minute,
// and whatever its kind gives back within a minute what was taken from it,
// so a longer wait is the estimate of others' use speaking, which the
// server's next answer corrects better than a wait does. A pause of
// longPause or more is logged with its reason; every one is counted
// (rates.paused).
const longPause = 10 * time.Second

// paceSpan is the span over which requests are spread: Azure OpenAI
// evaluates its requests limit over windows of 1 s or 10 s, each taking
// RPM × window / 1m, and OpenAI may enforce its limits over sub-minute
// windows. At most a second's share of the RPM goes in any second and a
// transit, so that the server, which sees them a transit late, counts no
// more in any of its seconds.
const paceSpan = time.Second + transit

// answerRecheck is the longest a request waits for an answer on its way to
// prove room for it before it looks again (an answer wakes it sooner).
const answerRecheck = time.Second

// perSecond is the requests that may go within any paceSpan: a second's
// share of the least requests limit, after the others' estimated use of
// a mirror's, at least one; ok is false with no requests limit known. A
// window's count that no header names the length of (Azure's) is taken
// as 10 s's: a tenth of it a second is within it whether its window is
// 1 s or 10 s. r.mu is held.
func (r *rates) perSecond() (n int, ok bool) {
	n = math.MaxInt
	if r.windowRequests > 0 {
		n, ok = max(1, int(r.windowRequests/10)), true
	}
	for _, b := range []*bucket{r.own[kindRequests], r.srv[kindRequests]} {
		if b != nil {
			n, ok = min(n, max(1, int((b.perSec-b.othersPerSec)*time.Second.Seconds()))), true
		}
	}
	return n, ok
}

// take waits until every bucket has room for a request of tokens, and
// takes it. A wait that would end after deadline returns a
// *fault.BackoffError at once, with when it would end.
func (r *rates) take(ctx context.Context, tokens int64, deadline time.Time) (reservation, error) {
	cost := [2]float64{float64(tokens), 1}
	var waited, longest time.Duration
	held := ""
	for {
		r.mu.Lock()
		now := time.Now()
		var wait time.Duration
		var which, label string
		pending := false // the longest wait ends with an answer on its way
		if n, ok := r.perSecond(); ok {
			i := 0
			for i < len(r.sends) && now.Sub(r.sends[i]) >= paceSpan {
				i++
			}
			r.sends = append(r.sends[:0], r.sends[i:]...)
			if len(r.sends) >= n {
				wait, which, label = r.sends[len(r.sends)-n].Add(paceSpan).Sub(now), "requests per second", "requests_per_second"
			}
		}
		replay, release := r.replayable(cost[kindTokens], now)
		for k := range 2 {
			for _, b := range []*bucket{r.own[k], r.srv[k]} {
				if b == nil || (replay && b.mirror && k == kindTokens) {
					continue
				}
				if cost[k] > b.capacity {
					if !b.mirror {
						r.mu.Unlock()
						return reservation{}, &tooLargeError{kindNames[k], cost[k], b.capacity}
					}
					// The server's limit, as its headers give it, is
					// below this request: no wait would let it through
					// the mirror. The server judges it instead (OpenAI
					// answers 429 "Request too large", an item's error),
					// and its answer's headers set the mirror again.
					continue
				}
				b.refill(now, r.inflight > 0)
				margin := 0.0
				if b.mirror && !b.lone() {
					// Alone, its floor and the proven room are exact or err
					// low: no margin for others' sends between answers.
					margin = math.Max(0, math.Min(r.margin(k), b.capacity-cost[k]))
					if r.pace > 0 && k == kindTokens {
						// Paced, its 429s cut the pace (limited), and
						// the margin is the same for every process, so
						// that the mirrors' room favours none: a margin
						// raised by its 429s, and slow to decay, held
						// this process out of room the others took (a
						// third of its share, for minutes). Capped at 6
						// typical requests, one of three still starved
						// against a sliding window about one run in five
						// (TestThreeModelsShareEachLimiterKind); capped at
						// 3, the shares were within 18% of the mean in
						// 20 runs of 20 of every kind; at 3 for all,
						// within 13%, with 0.0–0.6% 429s (2 for all:
						// 6%, but up to 1.2% against the fixed minute;
						// at 1 the windows met 1.3–3.1%).
						// In a sliding window, slidingMargin: its
						// room is proven (provenOnly), not refilled.
						margin = math.Max(0, math.Min(paceRulesOf(b, now).margin*r.typical, b.capacity-cost[k]))
					}
				}
				// With an answer on its way, a shared mirror sends only into
				// room proven; in a sliding window, with sends of its own
				// in the count, at all times (provenOnly).
				need := cost[k] + margin - b.level
				provenOnly := b.mirror && !b.lone() && k == kindTokens && r.pace > 0 && b.sliding(now) && b.ownHeld(now) > 0
				if unconfirmed := b.mirror && !b.lone() && (r.inflight > 0 || provenOnly) && b.proven < cost[k]+margin; need > 0 || unconfirmed {
					w := min(limitSpan, seconds(max(0, need)/(b.perSec-b.othersPerSec)))
					source, unproven := "configured_", false
					if b.mirror {
						source = "server_"
						switch {
						case b.lone() && b.floor(now) < cost[k]+margin:
							// Until its own sends leave the span.
							w = b.floorWait(cost[k]+margin, now)
						case r.inflight > 0:
							// Room an answer on its way may prove: it
							// wakes this wait, which is no reason to give
							// the batch back.
							w, unproven = answerRecheck, true
						case provenOnly:
							// Until its own next send leaves the window
							// (replayable) or an answer shows room.
							w = answerRecheck
							if !release.IsZero() {
								w = max(w, release.Sub(now))
							}
						}
						w = r.waits.server(w, "x-ratelimit-"+kindNames[k], "")
					}
					if w > wait {
						wait, which, label, pending = w, kindNames[k]+" per minute", source+kindNames[k], unproven
					}
				}
			}
		}
		if w := r.paceWait(cost[kindTokens], now); w > wait && !replay {
			wait, which, label, pending = w, "its share of a shared tokens limit", "shared_tokens", false
		}
		if wait <= 0 {
			r.seq++
			switch {
			case replay:
				r.replay -= cost[kindTokens]
			case r.pace > 0:
				r.paceLevel -= cost[kindTokens]
			}
			if held != "" {
				r.paused.WithLabelValues(held).Observe(waited.Seconds())
			}
			r.sends = append(r.sends, now)
			for k := range 2 {
				for _, b := range []*bucket{r.own[k], r.srv[k]} {
					if b != nil {
						b.level -= cost[k]
						if b.mirror {
							b.proven -= cost[k]
							b.charge(cost[k], now, r.seq)
						}
					}
				}
			}
			r.recent = append(r.recent, sent{at: now, tokens: cost[kindTokens], seq: r.seq})
			r.inflight++
			if r.typical == 0 {
				r.typical = cost[kindTokens]
			} else {
				r.typical += 0.1 * (cost[kindTokens] - r.typical)
			}
			res := reservation{tokens: cost[kindTokens], at: now, seq: r.seq}
			r.mu.Unlock()
			return res, nil
		}
		if label == "server_tokens" {
			r.mirrorBound(now)
		}
		ch := r.changed
		if !release.IsZero() && release.Sub(now) < wait {
			// Its own send leaving the server's count may be room
			// enough (replayable): a wait ends then, and so does a
			// backoff. A batch handed back past its own release (its
			// subscriber paused to the wait's end) would leave that room
			// to the others, and its part of the window with it. (A part
			// that fell in a minute with nothing waiting, the trace that
			// led here, was traced again with the subscribers' logs: a
			// subscriber out of work while the others held the queue in
			// their buffers, bench/modelserver.md, "The prefetch buffer
			// the others held".)
			wait = release.Sub(now)
		}
		until := now.Add(wait)
		logIt := wait >= longPause && until.After(r.loggedUntil)
		if logIt {
			r.loggedUntil = until
		}
		backoff := until.After(deadline) && !pending
		onPace := label == "shared_tokens"
		if backoff {
			r.heldBack(until, onPace, now)
		} else {
			r.hold(1, onPace, now)
		}
		r.mu.Unlock()
		if logIt {
			r.log.Info("requests wait for room under the rate limit", "limit", which, "wait", wait, "until", until,
				"source", label)
		}
		if backoff {
			return reservation{}, &fault.BackoffError{Until: until, Reason: "rate limit: " + which}
		}
		wait = r.waits.spread(wait)
		start := time.Now()
		err := sleep(ctx, wait, ch)
		waited += time.Since(start)
		r.mu.Lock()
		r.hold(-1, onPace, time.Now())
		r.mu.Unlock()
		if wait > longest {
			longest, held = wait, label
		}
		if err != nil {
			r.paused.WithLabelValues(held).Observe(waited.Seconds())
			return reservation{}, err
		}
	}
}

// ownWithin is the tokens the configured limits (Config.TPM, RPM) admit in
// d: the least of the TPM's and of the RPM's times maxTokens, the output
// ceiling (a request reserves its prompt too, so the RPM's errs high when
// max_tokens is at the ceiling and low when requests ask far less). ok is
// false with none configured. The server's limits, learned from its
// headers, are learnedWithin's.
func (r *rates) ownWithin(d time.Duration, maxTokens float64) (tokens float64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tokens = math.Inf(1)
	for k, b := range r.own {
		if b == nil {
			continue
		}
		n := b.perSec * d.Seconds()
		if k == kindRequests {
			n *= maxTokens
		}
		tokens, ok = math.Min(tokens, n), true
	}
	return tokens, ok
}

// learnedWithin is the tokens the server's limits, as the mirrors learned
// them from its headers, let this process pass in d: its share of their
// refill (the rate less the others' estimated consumption) over d, plus
// what the server says remains beyond the margin a mirror keeps; for the
// requests' mirror, times the typical request's tokens. This is what lets
// several subscribers on one endpoint share its limit with nothing
// configured: each one's budget follows the share the server's counts
// leave it. ok is false once the server has answered with no limits in its
// headers. Before its first answer the limits are unknown, and the
// subscriber, admitting at its first reading, would fill its whole budget
// at once: without a configured limit (ownWithin) that is bounded to
// preAnswer tokens then.
func (r *rates) learnedWithin(d time.Duration, preAnswer float64) (tokens float64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.answered {
		if r.own[kindTokens] != nil || r.own[kindRequests] != nil {
			return 0, false
		}
		return preAnswer, true
	}
	now := time.Now()
	tokens = math.Inf(1)
	for k, b := range r.srv {
		if b == nil {
			continue
		}
		b.refill(now, r.inflight > 0)
		n := (b.perSec-b.othersPerSec)*d.Seconds() + math.Max(0, b.level-r.margin(k))
		if k == kindRequests {
			n *= r.typical
		}
		tokens, ok = math.Min(tokens, n), true
	}
	if b := r.srv[kindTokens]; r.pace > 0 && b != nil && b.shared(now) {
		// Sharing the limit, this process sends at its pace (paceWait),
		// not at the refill the others leave: offered that, admission
		// took messages the pace then held past MaxWait, and each backed
		// off (34–50 messages a run in bench/modelserver.md).
		r.advancePace(now)
		tokens = math.Min(tokens, r.pace*d.Seconds()+math.Max(0, r.paceLevel))
	}
	return tokens, ok
}

// margin is what a mirror of kind keeps unspent. r.mu is held.
func (r *rates) margin(k int) float64 {
	if k == kindRequests {
		return r.marginK
	}
	return r.marginK * r.typical
}

// settle gives an own tokens bucket back what a request did not use: used
// is its usage's total tokens, 0 for a request that generated nothing.
func (r *rates) settle(res reservation, used int64) {
	if res.at.IsZero() {
		return
	}
	r.mu.Lock()
	r.inflight--
	if b := r.own[kindTokens]; b != nil {
		back := res.tokens - float64(used)
		if !r.basis.byUsage {
			// Charged at arrival, a request costs at least its
			// reservation; by usage, what it used past its expected
			// output is taken from the room too.
			back = math.Max(0, back)
		}
		b.level = math.Min(b.capacity, b.level+back)
	}
	r.mu.Unlock()
	r.notify()
}

// charged records what an answered request was charged: by a limiter that
// charges at arrival, its usage's prompt tokens plus floor, the request's
// certain part (call.floor: max output × choices, and the prompt tokens
// counted exactly, counted twice here, which errs high), never more than
// its reservation; by one that counts usage (chargeBasis), used, its
// usage's total tokens. The floor of a lone mirror (bucket.floor) counts
// it so from now on. h is the answer's headers.
func (r *rates) charged(res reservation, promptTokens, floor, used int64, h http.Header) {
	if res.at.IsZero() || promptTokens <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.srv[kindTokens]; b != nil {
		r.chargedAs(b, res.seq, float64(promptTokens+floor), float64(used), h, time.Now())
	}
}

// limited records a 429 of the server's rate limiter to the request of
// res, whose answer asks every request to wait until then: the mirrors
// keep a wider margin from now on, and the refused send, which the limiter
// did not count, is not spent again as it would leave the count
// (replayable). A process that waits out the server's pause is not limited
// by its work: its pace does not decay over it (advancePace, as over a
// backoff). It did, as no request waited in take while they waited at the
// gate, and a process held there through the first minute's race came out
// at the least pace, sent nothing for two minutes and kept a part of half
// the others' (about one run in five of TestBenchShare's 32-item batches
// against a sliding window).
// The pace is cut once in cutEvery: the 429s of one burst are one sign of
// congestion, as TCP reduces its window once for the losses of one window
// (RFC 6582); cut at each, the first minute's race left a process at a
// seventh of its pace.
func (r *rates) limited(res reservation, until time.Time) {
	r.mu.Lock()
	if until.After(r.backUntil) {
		r.heldBack(until, false, time.Now())
	}
	if b := r.srv[kindTokens]; b != nil {
		for i := range b.own {
			if s := &b.own[i]; s.seq == res.seq && s.at.Equal(res.at) {
				s.released = true
			}
		}
	}
	r.byArrival("a 429 of its rate limiter")
	r.marginK = math.Min(marginMax, r.marginK*marginRaise)
	r.clean = 0
	if now := time.Now(); r.pace > 0 && now.Sub(r.cut429At) >= cutEvery {
		r.advancePace(now)
		r.pace = math.Max(r.pace*paceRulesOf(r.srv[kindTokens], now).cut429, r.minPace())
		r.cutAt, r.cut429At = now, now
	}
	r.mu.Unlock()
}

// sync sets the mirrors from an answer's headers, read at now. ok is
// whether the answer was a success, of a request that took at least
// tokens (call.floor), sent at sentAt (its reservation's at; zero when
// unknown): the server has seen that request, whenever it was sent, so it
// is not among those taken off the answer's count as unseen.
//
// A success whose limit is below what its own request took contradicts
// itself: the server admitted what it says it never would. Such a limit
// is not believed: its mirror is dropped, and the next answer's headers
// set it again, so that one broken or hostile header cannot fail every
// later request as too large, with none ever sent again to correct it.
func (r *rates) sync(h http.Header, now time.Time, ok bool, tokens float64, sentAt time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answered = true
	if ok {
		if r.clean++; r.clean >= marginCleanRun {
			r.clean = 0
			r.marginK = math.Max(marginMin, r.marginK*marginDecay)
		}
	}
	i := 0
	for i < len(r.recent) && now.Sub(r.recent[i].at) > transit {
		i++
	}
	r.recent = append(r.recent[:0], r.recent[i:]...)
	var unseen [2]float64
	self := !sentAt.IsZero()
	for _, s := range r.recent {
		if self && s.at.Equal(sentAt) {
			self = false // the answered request itself: seen
			continue
		}
		unseen[kindTokens] += s.tokens
		unseen[kindRequests]++
	}
	more := false
	for k, kind := range kindNames {
		took := [2]float64{tokens, 1}[k]
		limit, okL := headerNumber(h, "x-ratelimit-limit-"+kind)
		inferred := false
		if !okL {
			// Azure OpenAI sends remaining counts and no limit: the
			// tokens of its minute, the requests of a window of 1 s or
			// 10 s, which one it does not say. A window's requests are
			// spread (perSecond), not mirrored over a minute; a
			// configured RPM spreads them as it is.
			remaining, okR := headerNumber(h, "x-ratelimit-remaining-"+kind)
			if !okR {
				continue
			}
			if k == kindRequests {
				if ok && r.own[k] == nil {
					r.windowRequests = math.Max(r.windowRequests, remaining+took)
				}
				continue
			}
			// The tokens limit is the configured one, else at least what
			// remains plus what the answered request took from it, the
			// most any answer has shown. Only where that request is
			// known to be in the count: one sent before the minute
			// restarted was charged to the last minute, not to the count
			// its answer shows, and its cost added to that count raised
			// the limit for good (a lone subscriber then met a 429 near
			// a minute's end in about 1 of 60 runs of
			// TestArrivalChargeKept).
			m := r.srv[k]
			switch {
			case r.own[k] != nil:
				limit = r.own[k].capacity
			case ok && m != nil && m.sameMinute(remaining, sentAt):
				limit = remaining + took
			default:
				limit = remaining
			}
			if m != nil && m.inferred {
				limit = math.Max(limit, m.capacity)
			}
			okL, inferred = true, true
		}
		if !okL || limit <= 0 {
			continue
		}
		if ok && limit < took && !inferred {
			if r.srv[k] != nil {
				r.srv[k] = nil
				more = true
			}
			r.log.Warn("the model server's rate-limit header contradicts the request it just answered: not followed",
				"header", "x-ratelimit-limit-"+kind, "limit", limit, "request", took)
			continue
		}
		b := r.srv[k]
		if b == nil {
			b = newBucket(limit, now, true)
			r.srv[k] = b
			more = true
		}
		b.capacity, b.inferred = limit, inferred
		if inferred {
			b.perSec = limit / limitSpan.Seconds()
		}
		remaining, okR := headerNumber(h, "x-ratelimit-remaining-"+kind)
		reset, okT := parseReset(h.Get("x-ratelimit-reset-" + kind))
		if okT {
			reset = r.waits.server(reset, "x-ratelimit-reset-"+kind, h.Get("x-ratelimit-reset-"+kind))
		}
		if okR && okT && remaining < limit && reset > 0 {
			// Never below the limit a minute: early in a fixed minute
			// (limit − remaining) / reset read as a refill of a few tokens
			// a second, a wait of 20 minutes for one message
			// (bench/modelserver.md).
			b.rateReading((limit-remaining)/reset.Seconds(), now)
		}
		if okR {
			b.refill(now, r.inflight > 0)
			before := b.proven
			// The answer proves its remaining count (a lone mirror's level
			// is also bounded by its floor: refill).
			b.proven = math.Min(remaining, limit) - unseen[k]
			b.level, b.last = b.proven, now
			b.estimate(math.Min(remaining, limit), now, r.basis.byUsage, sentAt)
			at := now
			if !sentAt.IsZero() {
				// The counts are the server's when it admitted the
				// request; a long generation makes them old at now.
				at = sentAt
			}
			b.observeWindow(remaining, reset, okT, at, now)
			if okT && k == kindTokens {
				b.observeSliding(remaining, reset, now)
			}
			if k == kindTokens && ok {
				r.congestion(b, now)
			}
			// Waiters wake only for more room than was proven.
			more = more || b.proven > before
		}
	}
	if !sentAt.IsZero() {
		// The answer came at now; its processing time (processing) dates
		// its arrival closer: the generation is not the send's delay.
		seen := now
		if d, ok := processing(h); ok {
			seen = now.Add(-d)
		}
		for _, b := range r.srv {
			if b != nil {
				b.answered(sentAt, seen)
			}
		}
	}
	if more {
		close(r.changed)
		r.changed = make(chan struct{})
	}
}

func (r *rates) notify() {
	r.mu.Lock()
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func headerNumber(h http.Header, name string) (float64, bool) {
	v := strings.TrimSpace(h.Get(name))
	if v == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	return f, err == nil && f >= 0 && !math.IsInf(f, 0)
}

// processing is how long the server took over the request an answer
// answers, as its headers say: OpenAI's openai-processing-ms, "time taken
// processing your API request" (API reference, "Debugging requests"), or
// LiteLLM's x-litellm-response-duration-ms (its proxy's response headers),
// measured "from when its handler starts" (its latency troubleshooting
// page). ok is false where neither is sent.
func processing(h http.Header) (time.Duration, bool) {
	for _, name := range []string{"openai-processing-ms", "x-litellm-response-duration-ms"} {
		if ms, ok := headerNumber(h, name); ok {
			return seconds(ms / 1000), true
		}
	}
	return 0, false
}

// parseReset reads an x-ratelimit-reset value: a duration as OpenAI writes
// them ("12ms", "6m0s", "1h2m3s") or a number of seconds. A value past
// what a Duration holds reads as the longest one: the ceiling
// (waits.server) is the caller's.
func parseReset(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return d, true
	}
	if f, ok := number(v); ok {
		return seconds(f), true
	}
	return 0, false
}

// retryAfter reads the wait an answer asks for, and the header it came
// from: retry-after-ms, then Retry-After in seconds or as an HTTP date,
// the order the OpenAI SDKs read them in. ok is false when there is none.
// A wait past what a Duration holds reads as the longest one: the ceiling
// is the caller's (Model.retryAfter).
func retryAfter(h http.Header, now time.Time) (d time.Duration, header string, ok bool) {
	if v := strings.TrimSpace(h.Get("retry-after-ms")); v != "" {
		if f, ok := number(v); ok {
			return seconds(f / 1000), "retry-after-ms", true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, "", false
	}
	if f, ok := number(v); ok {
		return seconds(f), "Retry-After", true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now)), "Retry-After", true
	}
	return 0, "", false
}

// retryAfter is the wait an answer asks for (retryAfter), within the
// ceiling on any wait a server asks for.
func (m *Model) retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	d, header, ok := retryAfter(h, now)
	if !ok {
		return 0, false
	}
	return m.waits.server(d, header, h.Get(header)), true
}

// number reads a number of a header that is 0 or more, a number too large
// for a float64 as +Inf.
func number(v string) (float64, bool) {
	f, err := strconv.ParseFloat(v, 64)
	return f, (err == nil || errors.Is(err, strconv.ErrRange)) && f >= 0
}

// seconds is f seconds as a Duration, the longest one past what it holds.
func seconds(f float64) time.Duration {
	if f >= float64(math.MaxInt64)/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(f * float64(time.Second))
}
