// Package docs holds paygate's reference documentation; its test checks the links.
package docs
