// Live regions: every data-live-every seconds the page's own URL is fetched again and each element
// marked data-live (by id) is replaced by its new version, with no reload. When the page's state
// (data-live-state) changes to one that is not live any more, the page reloads once to show what
// the new state has (a finished job's results and figures); then nothing polls.
(function () {
  var root = document.querySelector("[data-live-state]");
  if (!root) return;
  var every = 1000 * parseFloat(root.getAttribute("data-live-every") || "2");
  var live = (root.getAttribute("data-live-while") || "").split(" ");
  function tick() {
    fetch(window.location.href, {cache: "no-store", credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var next = doc.querySelector("[data-live-state]");
        var state = next ? next.getAttribute("data-live-state") : "";
        if (live.indexOf(state) < 0) { window.location.reload(); return; }
        document.querySelectorAll("[data-live]").forEach(function (node) {
          var fresh = doc.getElementById(node.id);
          if (fresh && fresh.innerHTML !== node.innerHTML) node.replaceWith(fresh);
        });
        root.setAttribute("data-live-state", state);
        setTimeout(tick, every);
      })
      .catch(function () { setTimeout(tick, every * 3); });
  }
  setTimeout(tick, every);
})();
