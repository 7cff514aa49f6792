/* Trajectory viewer: token id toggle and the hover read-out (textContent only). */
"use strict";
(function () {
  var view = document.getElementById("token-view");
  var toggle = document.getElementById("toggle-ids");
  var info = document.getElementById("token-info");
  if (!view) { return; }
  if (toggle) {
    toggle.addEventListener("click", function () {
      var on = view.classList.toggle("ids");
      toggle.textContent = on ? "show text" : "show ids";
    });
  }
  view.addEventListener("mouseover", function (event) {
    var tok = event.target.closest(".tok");
    if (!tok || !info) { return; }
    var kind = tok.classList.contains("tok-model") ? "model" : tok.classList.contains("tok-obs") ? "observation" : "prompt";
    var text = "position " + tok.dataset.pos + " · id " + tok.dataset.id + " · " + kind;
    if (tok.dataset.logprob) {
      var lp = Number(tok.dataset.logprob);
      text += " · logprob " + lp.toFixed(4) + " (p " + Math.exp(lp).toFixed(3) + ")";
    }
    info.textContent = text;
  });
})();
