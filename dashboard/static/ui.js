// Sluice dashboard: live figures as a progressive enhancement. Every page
// works without this file; with it, the fragments the server renders arrive
// over server-sent events and replace their elements in place (no reload),
// and the charts are fetched again every 30 seconds.
(function () {
  'use strict';
  var body = document.body;
  var src = body.getAttribute('data-live');
  var status = document.getElementById('live-status');
  var updates = 0;

  function setStatus(text, state) {
    if (!status) { return; }
    status.textContent = text;
    status.setAttribute('data-state', state);
  }

  if (src && window.EventSource) {
    var es = new EventSource(src);
    var pending = {};
    ['windows', 'tenants', 'queues'].forEach(function (name) {
      es.addEventListener(name, function (e) {
        var el = document.getElementById('live-' + name);
        if (!el) { return; }
        // Do not pull the element from under a keyboard user: wait until
        // focus leaves it.
        if (el.contains(document.activeElement) && document.activeElement !== body) {
          pending[name] = e.data;
          return;
        }
        el.innerHTML = e.data;
        updates++;
        body.setAttribute('data-live-updates', String(updates));
        setStatus('Live: updated every second', 'on');
      });
    });
    document.addEventListener('focusout', function () {
      setTimeout(function () {
        Object.keys(pending).forEach(function (name) {
          var el = document.getElementById('live-' + name);
          if (el && !el.contains(document.activeElement)) {
            el.innerHTML = pending[name];
            delete pending[name];
          }
        });
      }, 0);
    });
    es.addEventListener('trouble', function (e) { setStatus(e.data, 'stale'); });
    es.onopen = function () { setStatus('Live: connected', 'on'); };
    es.onerror = function () { setStatus('Live: reconnecting…', 'off'); };
    window.addEventListener('pagehide', function () { es.close(); });
  }

  var charts = document.querySelectorAll('img[data-refresh]');
  if (charts.length) {
    setInterval(function () {
      Array.prototype.forEach.call(charts, function (img) {
        var url = img.getAttribute('data-refresh');
        img.src = url + (url.indexOf('?') < 0 ? '?' : '&') + 't=' + Date.now();
      });
    }, 30000);
  }
}());
