//go:build !race

package refembed

const raceDetector = false
