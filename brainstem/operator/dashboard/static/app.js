// The dashboard's only script, served by the app: the CSP allows no inline script or event handler.
// Everything it shows from the server goes in as text (textContent, dataset), never as HTML.
"use strict";
(function () {
  // A timeline's waterfall bars: their place comes in data attributes, since style attributes in the
  // page would need 'unsafe-inline' styles. Setting them here is not an inline style.
  function bars() {
    document.querySelectorAll(".wf span[data-left]").forEach(function (s) {
      var left = parseFloat(s.dataset.left), width = parseFloat(s.dataset.width);
      if (isFinite(left)) { s.style.left = left + "%"; }
      if (isFinite(width)) { s.style.width = width + "%"; }
    });
  }

  // A select that submits its form when changed (the sessions' outcome filter).
  function autosubmit() {
    document.querySelectorAll("select[data-autosubmit]").forEach(function (el) {
      el.addEventListener("change", function () { el.form.submit(); });
    });
  }

  // /live: poll the newest session's karma every 1.5 s and append its lines.
  function live(log) {
    var sid = log.dataset.session, agent = log.dataset.agent, next = 0;
    function poll() {
      var q = "?after=" + next + (sid ? "&session=" + encodeURIComponent(sid) : "") +
        (agent ? "&agent=" + encodeURIComponent(agent) : "");
      fetch("/api/karma" + q, {credentials: "same-origin"}).then(function (r) { return r.json(); }).then(function (d) {
        if (d.latest && d.latest !== sid) {
          sid = d.latest; next = 0; log.textContent = ""; document.getElementById("state").textContent = "";
          var a = document.getElementById("sid");
          a.textContent = sid;
          a.href = "/sessions/" + encodeURIComponent(sid) + (agent ? "?agent=" + encodeURIComponent(agent) : "");
          return;
        }
        if (!sid && d.session) { sid = d.session; }
        d.entries.forEach(function (e) { log.textContent += e.line + "\n"; });
        next = d.next;
        if (d.entries.length) {  // an empty poll says nothing about whether the session has ended
          document.getElementById("state").textContent =
            d.entries.some(function (e) { return e.event === "session_end"; }) ? "(ended)" : "";
        }
      }).catch(function () {}).then(function () { setTimeout(poll, 1500); });
    }
    poll();
  }

  // /actions/ID: while the action runs, ask every second whether it has ended; then show its result.
  function follow(el) {
    var agent = el.dataset.agent;
    function poll() {
      var q = agent ? "?agent=" + encodeURIComponent(agent) : "";
      fetch("/api/actions/" + encodeURIComponent(el.dataset.action) + q, {credentials: "same-origin"})
        .then(function (r) { return r.json(); }).then(function (d) {
          if (d.state !== "running" || (d.session_id && !document.querySelector("a[href^='/sessions/']"))) {
            window.location.reload();
            return;
          }
          setTimeout(poll, 1000);
        }).catch(function () { setTimeout(poll, 3000); });
    }
    setTimeout(poll, 1000);
  }

  // A form that starts something is sent once: its button waits while the page changes.
  function once() {
    document.querySelectorAll("form.act").forEach(function (f) {
      f.addEventListener("submit", function () {
        f.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
      });
    });
  }

  function start() {
    bars();
    autosubmit();
    once();
    var action = document.getElementById("action");
    if (action && action.dataset.state === "running") { follow(action); }
    var log = document.getElementById("log");
    if (log && log.hasAttribute("data-live")) { live(log); }
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
