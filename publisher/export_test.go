package publisher

// TimedHeap is timedHeap, for the tests of package publisher_test.
var TimedHeap = timedHeap
