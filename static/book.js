
/* The book's own behaviour, appended by d2lbook to _static/d2l.js (see
   include_js in config.ini), so it runs after d2lbook's tab-bar code. The
   functions d2lbook's code calls by name (tagClick, select_tab) are assigned
   here, not declared: a declaration is hoisted and would lose to an earlier
   assignment of the same name in d2l.js.

   Framework tabs. d2lbook shows a code block in several frameworks behind a
   tab bar. Its links call tagClick(name) (which d2lbook defines only inside
   its analytics snippet, removed from this book by scripts/offline_html.py)
   and then select_tab(index), which switches every tab bar on the page to the
   index-th tab. A bar that lacks a framework (a block written for pytorch and
   paddle only) has fewer tabs, so switching by index shows the wrong
   framework there. Here the switch goes by name, and the reader's choice is
   remembered so the next page opens on the same framework. */

var BOOK_TAB_KEY = 'd2l-multi-gpu.framework';
var bookChosenTab = null;

function bookStoredTab() {
  try {
    return window.localStorage.getItem(BOOK_TAB_KEY);
  } catch (e) {  // Storage may be disabled (private mode, strict file:// policy).
    return null;
  }
}

function bookShowTab(name) {
  $('.mdl-tabs').each(function () {
    var bar = $(this).children('.mdl-tabs__tab-bar');
    var links = bar.children('.mdl-tabs__tab');
    var hasTab = false;
    links.each(function () {
      var panelId = $(this).attr('href').slice(1);
      var active = $.trim($(this).text()) === name;
      hasTab = hasTab || active;
      $(this).toggleClass('is-active', active);
      $(document.getElementById(panelId)).toggleClass('is-active', active);
    });
    // A block with no code for this framework: say so instead of showing
    // another framework's code under the wrong tab.
    $(this).toggleClass('book-tab-missing', !hasTab);
    bar.attr('data-missing-tab', hasTab ? null : name);
  });
}

// Called by every tab link (onclick) before select_tab.
var tagClick = function (name) {
  bookChosenTab = name;
  try {
    window.localStorage.setItem(BOOK_TAB_KEY, name);
  } catch (e) {
    // Not remembered across pages then; this page still switches.
  }
};

// Replaces d2lbook's select_tab(index); the index is ignored in favour of
// the name given to tagClick, or the stored choice, or the book's first tab.
var select_tab = function (index) {
  var first = $('.mdl-tabs__tab-bar .mdl-tabs__tab').first();
  var name = bookChosenTab || bookStoredTab() || $.trim(first.text());
  var known = $('.mdl-tabs__tab').filter(function () {
    return $.trim($(this).text()) === name;
  }).length > 0;
  if (!known) {
    name = $.trim(first.text());
  }
  if (name) {
    bookShowTab(name);
  }
};

/* Search. Sphinx's search page fetch()es each hit's page to cut an excerpt
   from its text. Opened from disk, a page may not fetch() another file
   (Chromium treats every file as its own origin), so there the pages' texts
   come from _static/search-texts.js, which scripts/offline_html.py writes
   and the search page loads: a fetch of a page is answered from it. */
if (window.location.protocol === 'file:' && window.DOCUMENTATION_OPTIONS) {
  window.fetch = (function (fetchFile) {
    return function (url) {
      var name = String(url);
      var root = DOCUMENTATION_OPTIONS.URL_ROOT || '';
      if (!/\.html$/.test(name)) {
        return fetchFile.apply(this, arguments);
      }
      if (root && name.indexOf(root) === 0) {
        name = name.slice(root.length);
      }
      name = name.replace(/^\.\//, '').replace(/\.html$/, '');
      var texts = window.BOOK_SEARCH_TEXTS || {};
      var text = Object.prototype.hasOwnProperty.call(texts, name)
        ? texts[name] : '';  // no excerpt rather than a failed load
      var escaped = text.replace(/&/g, '&amp;').replace(/</g, '&lt;');
      return Promise.resolve(new Response(
        text ? '<div role="main">' + escaped + '</div>' : '',
        {headers: {'Content-Type': 'text/html'}}));
    };
  }(window.fetch));
}
