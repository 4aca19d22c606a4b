# Sphinx configuration of the collection's HTML docs (`make docs`; scripts/docs.sh).
# antsibull-docs writes the pages (simplified RST: one page per module, plugin and role, from
# the same DOCUMENTATION, RETURN and argument_specs that ansible-doc shows), Sphinx renders
# them with its built-in theme. The Ansible docsite theme and extension are not on the
# package indexes this project may use, which is why the simplified format is used.
project = "mlinfra.kvm"
author = "mlinfra.kvm contributors"
root_doc = "index"
html_theme = "alabaster"
html_title = "mlinfra.kvm collection"
html_show_sourcelink = False
pygments_style = "sphinx"
