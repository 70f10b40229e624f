"""The fit floor: a generic batched least-squares engine (``solver``: Levenberg–Marquardt and Adam as
frozen option objects, robust losses, device dispatch), ``uncertainty``, trace ``features``, the SLIM
(``slim``: calibrate, predict) and capacity-roofline (``roofline``) problems, the peer ``baselines``
and the paper's generalization study (``validate``). Imports the floors below it.
"""
