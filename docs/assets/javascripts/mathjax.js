// MathJax 3's configuration, read when the local copy (assets/mathjax, staged by docs/build.py from the
// django-static-mathjax wheel: no CDN, the site works offline) loads after this file (mkdocs.yml extra_javascript).
// Notebook pages: mkdocs-jupyter's loader finds this copy and typesets each notebook; Markdown pages: the
// `arithmatex` spans of pymdownx.arithmatex are typeset here.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
    tags: "ams",
    useLabelIds: true
  },
  startup: {
    typeset: false,               // notebooks: mkdocs-jupyter typesets them; elsewhere only arithmatex elements
    pageReady() {
      return MathJax.startup.defaultPageReady().then(() => {
        const math = Array.from(document.querySelectorAll(".arithmatex"))
          .filter(e => !e.closest(".jupyter-wrapper"));
        return math.length ? MathJax.typesetPromise(math) : null;
      });
    }
  }
};
