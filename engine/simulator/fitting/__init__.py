"""Cost models for ``model.runner=simulated``: the model (an iteration's time from its shape), fitting one
to the real runner (``stallfree-profile``), rescaling one by a speed check, and the committed fits
(``cost_models/``)."""
