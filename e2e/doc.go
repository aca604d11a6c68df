// Package e2e holds the browser tests of the gateway's dashboard: a
// gateway in demo mode runs in the test's process and headless Chromium,
// driven through the DevTools protocol (chromedp), loads /-/lb and watches
// it follow the list changes without a reload; with 1,000 services it checks
// that the page renders them folded and that the filter narrows them to one
// (and logs the times), and with a backend whose port refuses connections
// that the tripped breaker and the avoided zone show as they happen.
//
// It is a module of its own so that the main module does not depend on
// chromedp. The tests skip when no Chromium is installed; .ci/run installs
// Debian's chromium package. Run them with
//
//	cd e2e && go test ./...
//
// PUSHLB_SCREENSHOT=../docs/dashboard.png also saves a screenshot of the
// page.
package e2e
