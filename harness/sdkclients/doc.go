// Package sdkclients runs the publisher's provider-compatible APIs with the
// providers' own SDKs, which the product's module may not depend on (issue
// 32): its tests need the emulator (AWS_ENDPOINT_URL) and skip without it.
package sdkclients
