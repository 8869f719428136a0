// Tandem portal: small progressive enhancements. Every page works without this file.
(function () {
  "use strict";

  function announce(msg) {
    var live = document.getElementById("live-region");
    if (live) { live.textContent = ""; setTimeout(function () { live.textContent = msg; }, 30); }
  }

  // Copy buttons: data-copy-target="#id" copies that input's value or element's text.
  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    var ta = document.createElement("textarea");
    ta.value = text; ta.setAttribute("readonly", ""); ta.style.position = "absolute"; ta.style.left = "-9999px";
    document.body.appendChild(ta); ta.select();
    try { document.execCommand("copy"); } finally { document.body.removeChild(ta); }
    return Promise.resolve();
  }
  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest("[data-copy-target]");
    if (!btn) return;
    var target = document.querySelector(btn.getAttribute("data-copy-target"));
    if (!target) return;
    var text = "value" in target && target.tagName !== "PRE" ? target.value : target.textContent;
    copyText(text.trim()).then(function () {
      var label = btn.textContent;
      btn.textContent = "Copied"; btn.setAttribute("data-copied", "true");
      announce("Copied to the clipboard");
      setTimeout(function () { btn.textContent = label; }, 1600);
    });
  });

  // A new secret's field selects itself when focused, ready to copy by hand.
  document.addEventListener("focusin", function (ev) {
    if (ev.target.matches("[data-select-on-focus]")) ev.target.select();
  });

  // The team switcher submits itself on change (its button is there for no-JS use).
  document.addEventListener("change", function (ev) {
    if (ev.target.matches("[data-autosubmit]")) ev.target.form.requestSubmit();
  });

  // Request form: picking an instance type sets GPUs per node and TP to all of its GPUs.
  document.addEventListener("change", function (ev) {
    var sel = ev.target;
    if (!sel.matches("[data-pool-instance]")) return;
    var gpusByType = JSON.parse(document.getElementById("instance-gpus").textContent);
    var pool = sel.getAttribute("data-pool-instance");
    var gpus = gpusByType[sel.value];
    if (gpus === undefined) return;
    var g = document.getElementById("id_" + pool + "_gpus_per_node");
    var tp = document.getElementById("id_" + pool + "_tensor_parallel_size");
    if (g) g.value = gpus;
    if (tp) tp.value = Math.max(gpus, 1);
    var runtime = document.getElementById("id_runtime");
    if (runtime && gpus === 0) {
      for (var i = 0; i < runtime.options.length; i++) if (/CPU/.test(runtime.options[i].text)) runtime.value = runtime.options[i].value;
    }
  });

  // Error slots swapped in out of band: keep aria-invalid on their inputs in step.
  document.addEventListener("htmx:afterSettle", function () {
    document.querySelectorAll(".field-error[id^='err-']").forEach(function (slot) {
      var input = document.getElementById("id_" + slot.id.slice(4));
      if (input) input.setAttribute("aria-invalid", slot.textContent.trim() ? "true" : "false");
    });
  });

  // Snippet tabs (without JS every snippet is shown under its heading).
  document.addEventListener("click", function (ev) {
    var tab = ev.target.closest("[role=tab]");
    if (!tab) return;
    var list = tab.closest("[role=tablist]");
    list.querySelectorAll("[role=tab]").forEach(function (t) {
      var on = t === tab;
      t.setAttribute("aria-selected", on ? "true" : "false");
      t.tabIndex = on ? 0 : -1;
      document.getElementById(t.getAttribute("aria-controls")).hidden = !on;
    });
  });
  document.addEventListener("keydown", function (ev) {
    var tab = ev.target.closest && ev.target.closest("[role=tab]");
    if (!tab || (ev.key !== "ArrowRight" && ev.key !== "ArrowLeft")) return;
    var tabs = Array.prototype.slice.call(tab.closest("[role=tablist]").querySelectorAll("[role=tab]"));
    var next = tabs[(tabs.indexOf(tab) + (ev.key === "ArrowRight" ? 1 : tabs.length - 1)) % tabs.length];
    next.focus(); next.click();
  });
})();
