//go:build !race

package gpu

const raceDetector = false
