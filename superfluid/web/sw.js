// The web app's service worker (served at /sw.js so that its scope is the whole app): the
// pages and their files come from the network first, and from the last copy when the daemon
// cannot be reached, so an installed app still opens and says so. The API is never touched.
const CACHE = "superfluid-ui-v1";
const OWN = (path) => path === "/" || path === "/monitor" || path.startsWith("/ui/");

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));
self.addEventListener("fetch", (event) => {
  const url = new URL(event.request.url);
  if (event.request.method !== "GET" || url.origin !== self.location.origin || !OWN(url.pathname)) return;
  event.respondWith(fetch(event.request).then((response) => {
    if (response.ok) {
      const copy = response.clone();
      event.waitUntil(caches.open(CACHE).then((cache) => cache.put(event.request, copy)));
    }
    return response;
  }).catch(() => caches.match(event.request).then((hit) => hit || Response.error())));
});
