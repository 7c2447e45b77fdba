// Progressive enhancement: select a turn without reloading the page. Without this
// script every bar is a plain link (?turn=N) and the server renders the turn.
(function () {
  "use strict";
  var chart = document.getElementById("chart");
  var panel = document.getElementById("turn");
  if (!chart || !panel || !window.fetch) return;
  var base = document.body.getAttribute("data-turns");
  if (!base) return;
  function select(turn, push) {
    panel.classList.add("loading");
    return fetch(base + encodeURIComponent(turn), { credentials: "same-origin" })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
      .then(function (html) {
        panel.innerHTML = html;
        panel.classList.remove("loading");
        chart.querySelectorAll("a.bar.selected").forEach(function (a) { a.classList.remove("selected"); });
        var bar = chart.querySelector('a.bar[data-turn="' + turn + '"]');
        if (bar) bar.classList.add("selected");
        panel.setAttribute("data-turn", turn);
        if (push) history.pushState({ turn: turn }, "", "?turn=" + encodeURIComponent(turn));
      })
      .catch(function () { location.href = "?turn=" + encodeURIComponent(turn); });
  }
  chart.addEventListener("click", function (ev) {
    var bar = ev.target.closest && ev.target.closest("a.bar");
    if (!bar || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.button !== 0) return;
    ev.preventDefault();
    select(bar.getAttribute("data-turn"), true);
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.target.tagName === "INPUT" || (ev.key !== "ArrowLeft" && ev.key !== "ArrowRight")) return;
    var bars = Array.prototype.slice.call(chart.querySelectorAll("a.bar"));
    var at = bars.findIndex(function (a) { return a.classList.contains("selected"); });
    var next = bars[at + (ev.key === "ArrowLeft" ? -1 : 1)];
    if (next) select(next.getAttribute("data-turn"), true);
  });
  window.addEventListener("popstate", function (ev) {
    if (ev.state && ev.state.turn) select(ev.state.turn, false);
  });
})();
