/* The link to the same page in the book's other language (_ext/language_switch.py): it carries the
   section in view, by its position among the page's sections, and the page it opens scrolls there. */
(function () {
  "use strict";
  function sections() {
    return Array.prototype.slice.call(document.querySelectorAll("main article section[id], article.bd-article section[id]"))
      .filter(function (s, i, all) { return all.indexOf(s) === i; });
  }
  function current() {
    var all = sections(), at = 0;
    for (var i = 0; i < all.length; i++) {
      if (all[i].getBoundingClientRect().top <= 90) { at = i; }
    }
    return at;
  }
  function land() {
    var m = /[?&]section=(\d+)/.exec(window.location.search);
    if (!m) { return; }
    var target = sections()[parseInt(m[1], 10)];
    if (target) {
      target.scrollIntoView();
      // typeset math changes the page's height above the section: scroll again once MathJax is done
      if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
        MathJax.startup.promise.then(function () { target.scrollIntoView(); });
      }
      if (window.history && window.history.replaceState) {
        window.history.replaceState(null, "", window.location.pathname + "#" + target.id);
      }
    }
  }
  function install() {
    var meta = document.querySelector('meta[name="valuelab-other-language"]');
    if (!meta) { return; }
    var a = document.createElement("a");
    a.className = "vl-language-switch btn btn-sm";
    a.href = meta.getAttribute("content");
    a.textContent = meta.getAttribute("data-label");
    a.setAttribute("hreflang", meta.getAttribute("data-lang") || "");
    a.setAttribute("lang", meta.getAttribute("data-lang") || "");
    a.addEventListener("click", function (ev) {
      ev.preventDefault();
      window.location.href = meta.getAttribute("content") + "?section=" + current();
    });
    var bar = document.querySelector(".article-header-buttons");
    if (bar) { bar.insertBefore(a, bar.firstChild); }
    else {
      var article = document.querySelector("main article") || document.body;
      article.insertBefore(a, article.firstChild);
    }
    land();
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", install); }
  else { install(); }
})();
