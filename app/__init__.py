"""The Large-Batch Lab dashboard (Streamlit). Entry point: ``streamlit run app/server.py``
(``./lab start``), which serves the pages of ``app/main.py`` to their owner only.

The reading pages (Runs, Run detail, Compare) import no TensorFlow, so a fresh server answers
in about a second; the pages that build configs (Launch, Sweep) import it through
:mod:`app.form`.
"""
