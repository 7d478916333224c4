// Package sdkclients runs the publisher's provider-compatible APIs and the
// fake model server (internal/testenv/fakeoai) with the providers' own SDKs,
// which the product's module may not depend on (issue 32). The publisher's
// tests need the emulator (AWS_ENDPOINT_URL) and skip without it.
package sdkclients
