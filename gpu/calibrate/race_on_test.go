//go:build race

package calibrate

// raceDetector is whether the tests run under the race detector, which makes
// the reference model's arithmetic about ten times slower.
const raceDetector = true
